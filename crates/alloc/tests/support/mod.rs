//! Shared setup for the allocator tests: a formatted memory device, its cache, and a log
//! sequence model.

use std::cell::Cell;
use std::sync::Arc;

use cairn_alloc::{Allocator, LogSequence};
use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_bufcache::{BufferCache, CacheConfig};
use cairn_format::Geometry;

pub const UUID: [u8; 16] = [5; 16];

/// A log whose durable sequence moves when told to, counting forces.
#[derive(Debug, Default)]
pub struct TestLog {
    pub durable: Cell<u64>,
    pub forces: Cell<u64>,
}

impl LogSequence for TestLog {
    fn durable_sequence(&self) -> u64 {
        self.durable.get()
    }

    fn force(&self, sequence: u64) -> Result<(), String> {
        self.forces.set(self.forces.get() + 1);
        self.durable.set(self.durable.get().max(sequence));
        Ok(())
    }
}

/// A fresh filesystem of `bytes` with `block_size` blocks and `ag_count` AGs.
pub fn formatted(bytes: u64, block_size: u32, ag_count: u32) -> (Arc<dyn BlockDevice>, Geometry) {
    let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(bytes, 512));
    let request = cairn_mkfs::Request {
        block_size,
        ag_count: Some(ag_count),
        ..Default::default()
    };
    let plan = cairn_mkfs::plan(bytes, 512, &request).unwrap();
    let options = cairn_mkfs::FormatOptions {
        uuid: Some(UUID),
        discard: false,
        now_secs: 0,
    };
    cairn_mkfs::format(device.as_ref(), &plan, &options).unwrap();
    (device, plan.geometry)
}

pub fn cache(device: &Arc<dyn BlockDevice>, geometry: &Geometry) -> BufferCache {
    BufferCache::new(CacheConfig::from_geometry(geometry), Arc::clone(device)).unwrap()
}

pub fn allocator(geometry: &Geometry) -> Allocator {
    Allocator::new(*geometry, UUID)
}
