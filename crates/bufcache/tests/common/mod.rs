//! Shared test setup: a memory device whose blocks carry valid headers, and cache builders.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_bufcache::{BufferCache, CacheConfig, HeaderOps, ReadSpec};
use cairn_format::{HEADER_SIZE, MetaHeader, MetaKind, OnDisk, stamp};

pub const BLOCK_SIZE: u32 = 512;
pub const AG_BLOCKS: u32 = 64;
pub const AG_COUNT: u32 = 4;
pub const UUID: [u8; 16] = [7; 16];

pub static DIR_OPS: HeaderOps = HeaderOps::new(MetaKind::DirData);

pub fn spec() -> ReadSpec {
    ReadSpec::new(&DIR_OPS, UUID)
}

/// Byte `i` of block `block`'s body, so every block's contents are distinct.
pub fn pattern(block: u64, i: usize) -> u8 {
    (block as usize * 31 + i * 7) as u8
}

/// A device where every block is a valid one-block `DirData` block naming itself.
pub fn formatted_device() -> Arc<MemDevice> {
    let blocks = u64::from(AG_BLOCKS * AG_COUNT);
    let bs = BLOCK_SIZE as usize;
    let mut image = vec![0u8; blocks as usize * bs];
    for block in 0..blocks {
        let bytes = &mut image[block as usize * bs..(block as usize + 1) * bs];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = pattern(block, i);
        }
        MetaHeader::new(MetaKind::DirData, block, UUID, 0).encode(&mut bytes[..HEADER_SIZE]);
        stamp(bytes, None);
    }
    let device = MemDevice::from_image(image, BLOCK_SIZE).unwrap();
    device.set_recording(false);
    Arc::new(device)
}

pub fn config() -> CacheConfig {
    CacheConfig::new(BLOCK_SIZE, AG_BLOCKS, AG_COUNT)
}

pub fn cache_on(device: &Arc<MemDevice>, config: CacheConfig) -> BufferCache {
    let dyn_device: Arc<dyn BlockDevice> = device.clone();
    BufferCache::new(config, dyn_device).unwrap()
}
