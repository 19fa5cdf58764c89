//! Filesystem geometry: validated sizes and the address arithmetic built on them.

use crate::limits::*;
use crate::types::{AgBlock, AgNumber, FsBlock, InodeNumber};

/// Validated geometry. Constructed only through `Geometry::new`, so every method may assume
/// its invariants: power-of-two sizes in range, AGs of `ag_blocks` blocks (the last one may be
/// shorter but holds at least `AG_BLOCKS_MIN`), and a log inside one AG past its static blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub sector_size: u32,
    pub inode_size: u32,
    pub block_count: u64,
    pub ag_blocks: u32,
    pub ag_count: u32,
    pub log_start: u64,
    pub log_blocks: u32,
    /// Bits needed for an AG block number: `ceil(log2(ag_blocks))`.
    pub ag_block_bits: u32,
    /// `log2(block_size / inode_size)`.
    pub inodes_per_block_log: u32,
}

/// A rejected field: its name, its value and why.
pub type GeometryError = (&'static str, u64, &'static str);

impl Geometry {
    /// Validates raw geometry values (from mkfs options or a superblock) before any arithmetic.
    pub fn new(
        block_size: u32,
        sector_size: u32,
        inode_size: u32,
        block_count: u64,
        ag_blocks: u32,
        log_start: u64,
        log_blocks: u32,
    ) -> Result<Geometry, GeometryError> {
        check_pow2("block_size", block_size, BLOCK_SIZE_MIN, BLOCK_SIZE_MAX)?;
        check_pow2(
            "sector_size",
            sector_size,
            SECTOR_SIZE_MIN,
            SECTOR_SIZE_MAX.min(block_size),
        )?;
        check_pow2(
            "inode_size",
            inode_size,
            INODE_SIZE_MIN,
            INODE_SIZE_MAX.min(block_size),
        )?;
        if block_size / inode_size > INODES_PER_CHUNK {
            // A chunk of inodes must fill whole blocks, so one block may not hold more inodes
            // than a chunk does.
            return Err((
                "inode_size",
                u64::from(inode_size),
                "too small for this block size",
            ));
        }
        if !(AG_BLOCKS_MIN..=AG_BLOCKS_MAX).contains(&ag_blocks) {
            return Err((
                "ag_blocks",
                u64::from(ag_blocks),
                "outside the allowed AG size range",
            ));
        }
        if block_count < u64::from(AG_BLOCKS_MIN) || block_count > FS_BLOCK_MAX {
            return Err((
                "block_count",
                block_count,
                "outside the allowed filesystem size range",
            ));
        }
        let ag_count64 = block_count.div_ceil(u64::from(ag_blocks));
        if ag_count64 > u64::from(AG_COUNT_MAX) {
            return Err(("ag_count", ag_count64, "too many allocation groups"));
        }
        let last_ag_blocks = block_count - (ag_count64 - 1) * u64::from(ag_blocks);
        if last_ag_blocks < u64::from(AG_BLOCKS_MIN) {
            return Err((
                "block_count",
                block_count,
                "last allocation group is too small",
            ));
        }
        let geometry = Geometry {
            block_size,
            sector_size,
            inode_size,
            block_count,
            ag_blocks,
            ag_count: ag_count64 as u32,
            log_start,
            log_blocks,
            ag_block_bits: u32::BITS - (ag_blocks - 1).leading_zeros(),
            inodes_per_block_log: (block_size / inode_size).trailing_zeros(),
        };
        geometry.check_log()?;
        Ok(geometry)
    }

    fn check_log(&self) -> Result<(), GeometryError> {
        if self.log_blocks < LOG_BLOCKS_MIN {
            return Err(("log_blocks", u64::from(self.log_blocks), "log is too small"));
        }
        let ag = self.ag_of(FsBlock(self.log_start.min(self.block_count - 1)));
        let ag_start = self.ag_start(ag.0);
        let ag_end = ag_start + u64::from(self.ag_len(ag.0));
        let log_end = self.log_start.checked_add(u64::from(self.log_blocks));
        if self.log_start >= self.block_count
            || self.log_start < ag_start + u64::from(AG_FIRST_FREE)
            || log_end.is_none_or(|end| end > ag_end)
        {
            return Err((
                "log_start",
                self.log_start,
                "log is not inside one AG's free area",
            ));
        }
        Ok(())
    }

    pub fn ag_start(&self, ag: u32) -> u64 {
        u64::from(ag) * u64::from(self.ag_blocks)
    }

    /// Blocks in AG `ag` (the last AG may be shorter).
    pub fn ag_len(&self, ag: u32) -> u32 {
        debug_assert!(ag < self.ag_count);
        let rest = self.block_count - self.ag_start(ag);
        rest.min(u64::from(self.ag_blocks)) as u32
    }

    pub fn ag_of(&self, block: FsBlock) -> AgNumber {
        AgNumber((block.0 / u64::from(self.ag_blocks)) as u32)
    }

    pub fn ag_block_of(&self, block: FsBlock) -> AgBlock {
        AgBlock((block.0 % u64::from(self.ag_blocks)) as u32)
    }

    pub fn fs_block(&self, ag: AgNumber, block: AgBlock) -> FsBlock {
        FsBlock(self.ag_start(ag.0) + u64::from(block.0))
    }

    pub fn byte_offset(&self, block: FsBlock) -> u64 {
        block.0 * u64::from(self.block_size)
    }

    /// Blocks in one inode chunk (`INODES_PER_CHUNK` inodes).
    pub fn chunk_blocks(&self) -> u32 {
        INODES_PER_CHUNK >> self.inodes_per_block_log
    }

    pub fn inodes_per_block(&self) -> u32 {
        1 << self.inodes_per_block_log
    }

    /// Bits of an inode number below the AG number.
    pub fn ag_inode_bits(&self) -> u32 {
        self.ag_block_bits + self.inodes_per_block_log
    }

    pub fn inode_number(&self, ag: AgNumber, block: AgBlock, slot: u32) -> InodeNumber {
        debug_assert!(slot < self.inodes_per_block());
        let ag_inode = (u64::from(block.0) << self.inodes_per_block_log) | u64::from(slot);
        InodeNumber((u64::from(ag.0) << self.ag_inode_bits()) | ag_inode)
    }

    /// Splits an inode number into AG, AG block and slot, or `None` if it cannot exist here.
    pub fn inode_location(&self, ino: InodeNumber) -> Option<(AgNumber, AgBlock, u32)> {
        let ag = ino.0 >> self.ag_inode_bits();
        let ag_inode = ino.0 & ((1u64 << self.ag_inode_bits()) - 1);
        let block = ag_inode >> self.inodes_per_block_log;
        let slot = (ag_inode & u64::from(self.inodes_per_block() - 1)) as u32;
        if ag >= u64::from(self.ag_count) || block >= u64::from(self.ag_len(ag as u32)) {
            return None;
        }
        Some((AgNumber(ag as u32), AgBlock(block as u32), slot))
    }

    /// Whether `ino` names a slot inside the filesystem past the AG's static blocks.
    pub fn inode_is_valid(&self, ino: u64) -> bool {
        matches!(self.inode_location(InodeNumber(ino)), Some((_, b, _)) if b.0 >= AG_FIRST_FREE)
    }

    /// Filesystem block and byte offset within it where inode `ino` lives.
    pub fn inode_position(&self, ino: InodeNumber) -> Option<(FsBlock, usize)> {
        let (ag, block, slot) = self.inode_location(ino)?;
        Some((self.fs_block(ag, block), (slot * self.inode_size) as usize))
    }
}

fn check_pow2(field: &'static str, value: u32, min: u32, max: u32) -> Result<(), GeometryError> {
    if !value.is_power_of_two() || value < min || value > max {
        return Err((
            field,
            u64::from(value),
            "must be a power of two within the allowed range",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Geometry {
        Geometry::new(4096, 512, 512, 262_144, 65_536, 16, 2048).unwrap()
    }

    // Checks AG arithmetic on a 1 GiB geometry with four AGs.
    #[test]
    fn ag_arithmetic() {
        let g = sample();
        assert_eq!(g.ag_count, 4);
        assert_eq!(g.ag_block_bits, 16);
        assert_eq!(g.ag_len(3), 65_536);
        let b = g.fs_block(AgNumber(2), AgBlock(5));
        assert_eq!(g.ag_of(b), AgNumber(2));
        assert_eq!(g.ag_block_of(b), AgBlock(5));
    }

    // Checks that bad geometry is refused with the field named.
    #[test]
    fn bad_geometry_is_refused() {
        assert_eq!(
            Geometry::new(3000, 512, 512, 1 << 18, 1 << 16, 16, 2048)
                .unwrap_err()
                .0,
            "block_size"
        );
        assert_eq!(
            Geometry::new(4096, 8192, 512, 1 << 18, 1 << 16, 16, 2048)
                .unwrap_err()
                .0,
            "sector_size"
        );
        assert_eq!(
            Geometry::new(4096, 512, 8192, 1 << 18, 1 << 16, 16, 2048)
                .unwrap_err()
                .0,
            "inode_size"
        );
        assert_eq!(
            Geometry::new(4096, 512, 512, 1 << 18, 8, 16, 2048)
                .unwrap_err()
                .0,
            "ag_blocks"
        );
        // Last AG of 10 blocks is too small.
        assert_eq!(
            Geometry::new(4096, 512, 512, 65_546, 65_536, 16, 2048)
                .unwrap_err()
                .0,
            "block_count"
        );
        // Log over the AG's static blocks, and log past the AG's end.
        assert_eq!(
            Geometry::new(4096, 512, 512, 1 << 18, 1 << 16, 2, 2048)
                .unwrap_err()
                .0,
            "log_start"
        );
        assert_eq!(
            Geometry::new(4096, 512, 512, 1 << 18, 1 << 16, 65_000, 2048)
                .unwrap_err()
                .0,
            "log_start"
        );
    }

    proptest! {
        // Inode numbers round-trip through their location for any slot in the filesystem.
        #[test]
        fn inode_numbers_round_trip(ag in 0u32..4, block in 8u32..65_536, slot in 0u32..8) {
            let g = sample();
            let ino = g.inode_number(AgNumber(ag), AgBlock(block), slot);
            prop_assert_eq!(g.inode_location(ino), Some((AgNumber(ag), AgBlock(block), slot)));
            prop_assert!(g.inode_is_valid(ino.0));
        }

        // Arbitrary raw values never panic the validator.
        #[test]
        fn arbitrary_geometry_never_panics(
            bs: u32,
            ss: u32,
            is: u32,
            bc: u64,
            agb: u32,
            ls: u64,
            lb: u32,
        ) {
            let _ = Geometry::new(bs, ss, is, bc, agb, ls, lb);
        }
    }
}
