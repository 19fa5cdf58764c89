//! Replays the synthetic create and unlink traces and checks the lookaside hit rate goal
//! (at least 0.75 on "create" with 37 slots), which is deterministic, not a timing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_bufcache::trace::{TraceBuilder, TraceOp, replay};
use cairn_bufcache::{BufferCache, BufferOps, CacheConfig, ReadSpec};
use cairn_format::{FormatError, FsBlock, Lsn};

#[derive(Debug)]
struct RawOps;

impl BufferOps for RawOps {
    fn name(&self) -> &'static str {
        "trace block"
    }
    fn verify_read(&self, _: &[u8], _: FsBlock, _: &ReadSpec) -> Result<(), FormatError> {
        Ok(())
    }
    fn prepare_write(&self, _: &mut [u8], _: FsBlock, _: Option<Lsn>) -> Result<(), FormatError> {
        Ok(())
    }
}

static RAW: RawOps = RawOps;
const AG_BLOCKS: u32 = 1 << 16;
const AG_COUNT: u32 = 4;

fn cache(slots: u32) -> BufferCache {
    let device = MemDevice::new(u64::from(AG_BLOCKS * AG_COUNT) * 4096, 4096);
    device.set_recording(false);
    let device: Arc<dyn BlockDevice> = Arc::new(device);
    let config = CacheConfig::new(4096, AG_BLOCKS, AG_COUNT)
        .with_lookaside_slots(slots)
        .with_memory_limit_bytes(32 << 20);
    BufferCache::new(config, device).unwrap()
}

fn rate(cache: &BufferCache, ops: &[TraceOp]) -> (f64, f64) {
    let before = cache.stats();
    replay(cache, ops, &ReadSpec::new(&RAW, [0; 16])).unwrap();
    let after = cache.stats();
    let gets = (after.gets - before.gets) as f64;
    let lookaside = (after.lookaside_hits - before.lookaside_hits) as f64 / gets;
    let hits = (after.hits - before.hits) as f64 / gets;
    (lookaside, hits)
}

// Checks the create trace's lookaside hit rate at 37 slots, and that 0 slots means no hits.
#[test]
fn create_trace_hit_rate_meets_goal() {
    let mut builder = TraceBuilder::new(AG_COUNT, AG_BLOCKS, 1);
    let create = builder.create(100_000).take();
    let unlink = builder.unlink_all().take();
    let on = cache(37);
    let (create_rate, create_hits) = rate(&on, &create);
    let (unlink_rate, unlink_hits) = rate(&on, &unlink);
    on.check_invariants().unwrap();
    println!("create: lookaside {create_rate:.3}, all hits {create_hits:.3}");
    println!("unlink: lookaside {unlink_rate:.3}, all hits {unlink_hits:.3}");
    assert!(
        create_rate >= 0.75,
        "create lookaside hit rate {create_rate}"
    );
    let off = cache(0);
    let (off_rate, off_hits) = rate(&off, &create);
    assert_eq!(off_rate, 0.0);
    assert!((off_hits - create_hits).abs() < 0.01);
}

// Checks the trace shape: deterministic for a seed, and unlink frees what create made.
#[test]
fn traces_are_deterministic_and_balanced() {
    let build = || {
        let mut b = TraceBuilder::new(2, AG_BLOCKS, 9);
        b.create(1000);
        b.unlink_all();
        b.take()
    };
    let trace = build();
    assert_eq!(trace, build());
    let creates = trace
        .iter()
        .filter(|op| matches!(op, TraceOp::Create { .. }))
        .count();
    let frees = trace
        .iter()
        .filter(|op| matches!(op, TraceOp::Free { .. }))
        .count();
    // 1000 files in 2 dirs: 8 chunks of 4 clusters, 5 data blocks, 2 leaves (hash, inode)
    // per dir; unlink frees the clusters and data blocks, not the tree leaves.
    assert_eq!(creates, 2 * (8 * 4 + 5 + 2 + 1));
    assert_eq!(frees, 2 * (7 * 4 + 5));
}
