//! Shared helpers for the journal tests: a formatted memory device, a journal on it, and
//! header-carrying test blocks in a free area of AG 1.

#![allow(dead_code)]

pub mod oplog;

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_bufcache::{BufKey, BufferCache, CacheConfig, HeaderOps, ReadSpec};
use cairn_format::{HEADER_SIZE, MetaHeader, MetaKind, OnDisk, Superblock};
use cairn_journal::{Journal, JournalConfig, RecoveryReport, Transaction};
use cairn_mkfs::{FormatOptions, Request};

pub const UUID: [u8; 16] = [7; 16];
pub const SECTOR: u32 = 4096;
pub static DIR_OPS: HeaderOps = HeaderOps::new(MetaKind::DirData);

/// A freshly formatted memory device of `fs_bytes` with a log of `log_bytes` (or the default).
pub fn make_fs(fs_bytes: u64, log_bytes: Option<u64>) -> (Arc<MemDevice>, Superblock) {
    make_fs_with_sectors(fs_bytes, log_bytes, SECTOR)
}

/// As `make_fs`, on a device of `sector`-byte sectors (512 lets a crash tear a block).
pub fn make_fs_with_sectors(
    fs_bytes: u64,
    log_bytes: Option<u64>,
    sector: u32,
) -> (Arc<MemDevice>, Superblock) {
    let device = MemDevice::new(fs_bytes, sector);
    let request = Request {
        fs_bytes: Some(fs_bytes),
        log_bytes,
        ..Request::default()
    };
    let plan = cairn_mkfs::plan(fs_bytes, sector, &request).unwrap();
    let options = FormatOptions {
        uuid: Some(UUID),
        discard: false,
        now_secs: 0,
    };
    let report = cairn_mkfs::format(&device, &plan, &options).unwrap();
    device.clear_log();
    (Arc::new(device), report.superblock)
}

/// A journal (and fresh cache) over `device`.
pub fn open(
    device: &Arc<MemDevice>,
    superblock: &Superblock,
    config: JournalConfig,
) -> (Journal, RecoveryReport) {
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    let cache_config = CacheConfig::from_geometry(&superblock.geometry);
    let cache = Arc::new(BufferCache::new(cache_config, Arc::clone(&dyn_device)).unwrap());
    Journal::open(cache, dyn_device, superblock, config).unwrap()
}

/// Config for deterministic tests: no background thread.
pub fn quiet(mode: cairn_journal::LogMode) -> JournalConfig {
    JournalConfig {
        background: false,
        ..JournalConfig::with_mode(mode)
    }
}

pub fn spec() -> ReadSpec {
    ReadSpec::new(&DIR_OPS, UUID)
}

/// The `index`-th test block: free space a little past the end of the log (mkfs leaves the
/// rest of the log's AG free, and where the log lives is mkfs's choice).
pub fn test_block(superblock: &Superblock, index: u64) -> BufKey {
    let geometry = &superblock.geometry;
    BufKey::single(geometry.log_start + u64::from(geometry.log_blocks) + 100 + index)
}

/// Creates test block `index` in `tx` with a valid header and `fill` in its body.
pub fn create_block(tx: &mut Transaction<'_>, superblock: &Superblock, index: u64, fill: u8) {
    let key = test_block(superblock, index);
    let guard = tx.get_new_buf(key, &spec()).unwrap();
    let header = MetaHeader::new(MetaKind::DirData, key.block.0, UUID, 0);
    guard.write(0, &header.to_bytes()).unwrap();
    let len = guard.len();
    guard.bytes_mut(HEADER_SIZE..len).unwrap().fill(fill);
}

/// Reads the body (past the header) of test block `index` straight from the device.
pub fn read_body(device: &dyn BlockDevice, superblock: &Superblock, index: u64) -> Vec<u8> {
    let key = test_block(superblock, index);
    let block_size = superblock.geometry.block_size as usize;
    let mut raw = cairn_blockdev::AlignedBuf::zeroed(block_size);
    device
        .read_at(key.block.0 * block_size as u64, &mut raw)
        .unwrap();
    raw[HEADER_SIZE..].to_vec()
}
