//! A fixture for the recovery memory measurement (`docs/benchmarks.md`, "Recovery memory"):
//! fills most of the log of a formatted image with checkpoints of whole-block images of
//! distinct free blocks, forced, none written home, then stops as a crash would. Mounting
//! the image then replays all of it. Run by hand:
//! `CAIRN_FULL_LOG_IMAGE=IMG cargo test --release -p cairn-journal --test full_log -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use cairn_blockdev::{AlignedBuf, BlockDevice, FileDevice, OpenOptions};
use cairn_bufcache::{BufKey, BufferCache, CacheConfig, HeaderOps, ReadSpec};
use cairn_format::{HEADER_SIZE, MetaHeader, MetaKind, OnDisk, Superblock};
use cairn_journal::{Journal, JournalConfig, LogMode, Reservation};

static DIR_OPS: HeaderOps = HeaderOps::new(MetaKind::DirData);
/// Blocks per transaction.
const BATCH: u64 = 32;
/// Stop when this share (percent) of the log holds live checkpoints.
const FILL_PERCENT: u64 = 85;

#[test]
#[ignore = "a measurement fixture, run by hand with CAIRN_FULL_LOG_IMAGE"]
fn make_full_log_image() {
    let path = std::env::var("CAIRN_FULL_LOG_IMAGE").expect("CAIRN_FULL_LOG_IMAGE");
    let device: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::open(&path, &OpenOptions::new()).unwrap());
    let mut head = AlignedBuf::zeroed(65536);
    device.read_at(0, &mut head).unwrap();
    let superblock = Superblock::read_primary(&head).unwrap();
    let g = superblock.geometry;
    let uuid = superblock.uuid();
    let cache = Arc::new(BufferCache::new(CacheConfig::from_geometry(&g), device.clone()).unwrap());
    let config = JournalConfig {
        background: false,
        ..JournalConfig::with_mode(LogMode::Delayed)
    };
    let (journal, _) = Journal::open(cache, device.clone(), &superblock, config).unwrap();
    let spec = ReadSpec::new(&DIR_OPS, uuid);
    let log_sectors = u64::from(g.log_blocks) * u64::from(g.block_size / 512);
    // Free space of the last AG, far from the log and the root chunk.
    let first = g.ag_start(g.ag_count - 1) + 1024;
    let mut next = first;
    loop {
        let (lsn_head, lsn_tail) = journal.head_and_tail();
        let cycles = u64::from(lsn_head.cycle() - lsn_tail.cycle());
        let used = cycles * log_sectors + u64::from(lsn_head.block()) - u64::from(lsn_tail.block());
        if used * 100 >= log_sectors * FILL_PERCENT {
            break;
        }
        let reservation = Reservation::for_items(&g, BATCH as u32, g.block_size, 0, 0);
        let mut tx = journal.begin(reservation).unwrap();
        for block in next..next + BATCH {
            let guard = tx.get_new_buf(BufKey::single(block), &spec).unwrap();
            let header = MetaHeader::new(MetaKind::DirData, block, uuid, 0);
            guard.write(0, &header.to_bytes()).unwrap();
            let len = guard.len();
            guard.bytes_mut(HEADER_SIZE..len).unwrap().fill(block as u8);
        }
        next += BATCH;
        let sequence = tx.commit().unwrap();
        journal.force(sequence).unwrap();
    }
    eprintln!(
        "logged {} distinct blocks ({} MiB) in the log, none written home",
        next - first,
        ((next - first) * u64::from(g.block_size)) >> 20
    );
    // A crash: no unmount, nothing pushed home.
    drop(journal);
}
