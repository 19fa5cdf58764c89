//! Named limits and defaults of the extent status cache.

/// Entries a shrink call examines by default (ext4's `nr_to_scan` batch).
pub const SCAN_ENTRIES_PER_CALL_DEFAULT: u32 = 128;

/// Inodes one shrink call may take off the reclaim list by default, scanned or rotated.
pub const INODES_WALKED_PER_CALL_DEFAULT: u32 = 64;

/// Upper bound for `scan_entries_per_call`: a call must stay far below a millisecond.
pub const SCAN_ENTRIES_PER_CALL_MAX: u32 = 4096;

/// Upper bound for `inodes_walked_per_call`, for the same reason.
pub const INODES_WALKED_PER_CALL_MAX: u32 = 1024;

/// Estimated bytes of memory per cached entry: 8 (key) + 24 (entry) in a `BTreeMap` leaf of 11
/// slots that is on average about 2/3 full (~48 bytes per entry) plus internal nodes and the
/// allocator's rounding. Measured heap growth on the pressure workload is close to this.
pub const ENTRY_BYTES_ESTIMATE: u64 = 64;

/// Default high watermark: 64 MiB of entries (about a million entries).
pub const MEMORY_HIGH_BYTES_DEFAULT: u64 = 64 << 20;

/// Default low watermark: reclaim stops once the cache is back under this.
pub const MEMORY_LOW_BYTES_DEFAULT: u64 = 60 << 20;

/// Slots per chunk of the reclaim list's slab. Chunks are never moved once allocated, so adding
/// an inode never copies the list while the list lock is held.
pub const RECLAIM_CHUNK_SLOTS: usize = 1024;

/// Slots the statistics walk for the worst inode reads per hold of the reclaim-list lock.
pub const WORST_INODE_WALK_BATCH: usize = 256;

/// How long the background shrinker sleeps when it was not woken, in milliseconds.
pub const SHRINKER_IDLE_WAIT_MS: u64 = 100;

/// Stripes of the hit/miss counters; a thread keeps to one stripe so two threads doing
/// lookups on different inodes do not bounce one cache line.
pub const COUNTER_STRIPES: usize = 8;
