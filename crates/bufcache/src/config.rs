//! Cache configuration and the block-to-AG arithmetic derived from it.

use cairn_format::{FsBlock, Geometry};

use crate::BufCacheError;

/// Default lookaside slots per AG: the size the published kernel prototype measured with.
pub const LOOKASIDE_SLOTS_DEFAULT: u32 = 37;
/// Index hits of other buffers mapping to an occupied lookaside slot (with no hit of the
/// occupant in between) after which one of them takes the slot. Higher means less slot
/// rewriting when the working set is larger than the slots, lower means a new hot buffer gets
/// a slot sooner; chosen with the create trace and the 1,000-buffers-per-AG bench.
pub const LOOKASIDE_REPLACE_AFTER: u32 = 8;
/// Default memory limit for cached buffers.
pub const MEMORY_LIMIT_BYTES_DEFAULT: u64 = 64 << 20;
/// Default largest single write-back I/O built by coalescing adjacent buffers.
pub const DELWRI_BATCH_BYTES_DEFAULT: u32 = 1 << 20;
/// Largest buffer: a 64 KiB directory block.
pub const BUFFER_BYTES_MAX: u64 = 64 << 10;

/// How the cache maps blocks to AGs and how much it may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Filesystem block size in bytes (a multiple of the device's sector size).
    pub block_size: u32,
    /// Blocks per AG (the last AG may be shorter).
    pub ag_blocks: u32,
    pub ag_count: u32,
    /// Lookaside slots per AG; 0 disables the lookaside array.
    pub lookaside_slots: u32,
    /// Reclaim starts when cached buffers take more than this many bytes.
    pub memory_limit_bytes: u64,
    /// Largest write-back I/O made by joining adjacent dirty buffers.
    pub delwri_batch_bytes_max: u32,
}

impl CacheConfig {
    /// A configuration with default lookaside size, memory limit and batch size.
    pub fn new(block_size: u32, ag_blocks: u32, ag_count: u32) -> Self {
        Self {
            block_size,
            ag_blocks,
            ag_count,
            lookaside_slots: LOOKASIDE_SLOTS_DEFAULT,
            memory_limit_bytes: MEMORY_LIMIT_BYTES_DEFAULT,
            delwri_batch_bytes_max: DELWRI_BATCH_BYTES_DEFAULT,
        }
    }

    /// The configuration for a filesystem of geometry `geometry`.
    pub fn from_geometry(geometry: &Geometry) -> Self {
        Self::new(geometry.block_size, geometry.ag_blocks, geometry.ag_count)
    }

    #[must_use]
    pub fn with_lookaside_slots(mut self, slots: u32) -> Self {
        self.lookaside_slots = slots;
        self
    }

    #[must_use]
    pub fn with_memory_limit_bytes(mut self, bytes: u64) -> Self {
        self.memory_limit_bytes = bytes;
        self
    }

    #[must_use]
    pub fn with_delwri_batch_bytes_max(mut self, bytes: u32) -> Self {
        self.delwri_batch_bytes_max = bytes;
        self
    }

    /// Checks the configuration against a device of `device_bytes` with `sector` sectors.
    pub(crate) fn validate(&self, device_bytes: u64, sector: u32) -> Result<(), BufCacheError> {
        let bad = |field, value: u64, why| Err(BufCacheError::Config { field, value, why });
        let block = u64::from(self.block_size);
        if !self.block_size.is_power_of_two() || block > BUFFER_BYTES_MAX {
            return bad(
                "block_size",
                block,
                "must be a power of two of at most 64 KiB",
            );
        }
        if sector == 0 || !block.is_multiple_of(u64::from(sector)) {
            return bad(
                "block_size",
                block,
                "must be a multiple of the device sector",
            );
        }
        if self.ag_blocks == 0 {
            return bad("ag_blocks", 0, "must be positive");
        }
        if self.ag_count == 0 {
            return bad("ag_count", 0, "must be positive");
        }
        let first_blocks = u64::from(self.ag_count - 1) * u64::from(self.ag_blocks);
        if first_blocks.saturating_mul(block) >= device_bytes {
            return bad(
                "ag_count",
                u64::from(self.ag_count),
                "the last AG is past the device",
            );
        }
        if self.delwri_batch_bytes_max < self.block_size {
            let value = u64::from(self.delwri_batch_bytes_max);
            return bad(
                "delwri_batch_bytes_max",
                value,
                "must hold at least one block",
            );
        }
        Ok(())
    }
}

/// Block-to-AG arithmetic, precomputed so the hot path avoids a 64-bit division when the AG
/// size is a power of two (it usually is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AgMap {
    ag_blocks: u64,
    ag_shift: Option<u32>,
}

impl AgMap {
    pub(crate) fn new(ag_blocks: u32) -> Self {
        Self {
            ag_blocks: u64::from(ag_blocks),
            ag_shift: ag_blocks
                .is_power_of_two()
                .then(|| ag_blocks.trailing_zeros()),
        }
    }

    /// AG index and AG-relative block of `block`.
    #[inline]
    pub(crate) fn split(&self, block: FsBlock) -> (u64, u32) {
        match self.ag_shift {
            Some(shift) => (block.0 >> shift, (block.0 & (self.ag_blocks - 1)) as u32),
            None => (block.0 / self.ag_blocks, (block.0 % self.ag_blocks) as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the AG split for power-of-two and other AG sizes.
    #[test]
    fn ag_split_matches_division() {
        for ag_blocks in [64u32, 100, 1 << 16] {
            let map = AgMap::new(ag_blocks);
            for block in [0u64, 1, 63, 64, 99, 100, 12_345, 1 << 20] {
                let ag_blocks = u64::from(ag_blocks);
                let want = (block / ag_blocks, (block % ag_blocks) as u32);
                assert_eq!(map.split(FsBlock(block)), want);
            }
        }
    }

    // Checks that each unusable configuration value is named.
    #[test]
    fn bad_configs_are_refused() {
        let good = CacheConfig::new(4096, 1024, 4);
        assert!(good.validate(4 * 1024 * 4096, 512).is_ok());
        let cases = [
            (
                CacheConfig {
                    block_size: 3000,
                    ..good
                },
                "block_size",
            ),
            (
                CacheConfig {
                    block_size: 256,
                    ..good
                },
                "block_size",
            ),
            (
                CacheConfig {
                    ag_blocks: 0,
                    ..good
                },
                "ag_blocks",
            ),
            (
                CacheConfig {
                    ag_count: 0,
                    ..good
                },
                "ag_count",
            ),
            (
                CacheConfig {
                    ag_count: 5,
                    ..good
                },
                "ag_count",
            ),
            (
                good.with_delwri_batch_bytes_max(100),
                "delwri_batch_bytes_max",
            ),
        ];
        for (config, field) in cases {
            match config.validate(4 * 1024 * 4096, 512) {
                Err(BufCacheError::Config { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{config:?}: {other:?}"),
            }
        }
    }
}
