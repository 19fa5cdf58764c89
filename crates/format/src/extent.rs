//! File extent records (the data and attribute fork mappings) and the file extent tree's key
//! and pointer codecs.
//!
//! An extent is 16 bytes: two little-endian `u64` words, low word first, read together as one
//! 128-bit number `v = low | (high << 64)`:
//!
//! | bits     | width | field      | meaning                                          |
//! |----------|-------|------------|--------------------------------------------------|
//! | 127      | 1     | unwritten  | allocated but never written: reads as zeros      |
//! | 73..=126 | 54    | file_block | first logical block of the file it maps          |
//! | 21..=72  | 52    | fs_block   | first filesystem block                           |
//! | 0..=20   | 21    | length     | blocks, 1..=EXTENT_LEN_MAX                        |
//!
//! So bytes 0..8 hold the low word (length and the low 43 bits of `fs_block`) and bytes 8..16
//! the high word. Neither range may run past its maximum: `file_block + length - 1 <=
//! FILE_BLOCK_MAX` and `fs_block + length - 1 <= FS_BLOCK_MAX`.
//!
//! File extent tree: key = first logical block (`u64`, 8 bytes), pointer = `FsBlock`
//! (`u64`, 8 bytes); leaves hold extents.

use crate::FormatError;
use crate::limits::{EXTENT_LEN_MAX, FILE_BLOCK_MAX, FS_BLOCK_MAX};
use crate::ondisk::{OnDisk, bad_field, get_u64, need, put_u64};
use crate::types::{FsBlock, NULL_BLOCK};

const LENGTH_BITS: u32 = 21;
const FS_BLOCK_BITS: u32 = 52;
const FILE_BLOCK_SHIFT: u32 = LENGTH_BITS + FS_BLOCK_BITS;
const UNWRITTEN_BIT: u32 = 127;

/// One mapping of `length` file blocks from `file_block` onto `fs_block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub file_block: u64,
    pub fs_block: FsBlock,
    pub length: u32,
    pub unwritten: bool,
}

impl Extent {
    /// A validated extent; fails when a field is out of its bit range or a range overflows.
    pub fn new(
        file_block: u64,
        fs_block: FsBlock,
        length: u32,
        unwritten: bool,
    ) -> Result<Extent, FormatError> {
        let extent = Extent {
            file_block,
            fs_block,
            length,
            unwritten,
        };
        extent.validate()?;
        Ok(extent)
    }

    /// One past the last logical block.
    pub fn file_end(&self) -> u64 {
        self.file_block + u64::from(self.length)
    }

    /// One past the last filesystem block.
    pub fn fs_end(&self) -> FsBlock {
        FsBlock(self.fs_block.0 + u64::from(self.length))
    }

    fn validate(&self) -> Result<(), FormatError> {
        let bad = |field, value: u64, why| bad_field(Self::NAME, NULL_BLOCK, field, value, why);
        if self.length == 0 || self.length > EXTENT_LEN_MAX {
            return Err(bad(
                "length",
                self.length.into(),
                "outside 1..=EXTENT_LEN_MAX",
            ));
        }
        // Both maxima are far below 2^63, so adding a 21-bit length cannot overflow.
        if self.file_block > FILE_BLOCK_MAX
            || self.file_block + u64::from(self.length) - 1 > FILE_BLOCK_MAX
        {
            return Err(bad(
                "file_block",
                self.file_block,
                "runs past FILE_BLOCK_MAX",
            ));
        }
        if self.fs_block.0 > FS_BLOCK_MAX
            || self.fs_block.0 + u64::from(self.length) - 1 > FS_BLOCK_MAX
        {
            return Err(bad("fs_block", self.fs_block.0, "runs past FS_BLOCK_MAX"));
        }
        Ok(())
    }
}

impl OnDisk for Extent {
    const SIZE: usize = 16;
    const NAME: &'static str = "file extent";

    fn encode(&self, out: &mut [u8]) {
        debug_assert!(self.validate().is_ok());
        let packed = (u128::from(self.unwritten) << UNWRITTEN_BIT)
            | (u128::from(self.file_block & FILE_BLOCK_MAX) << FILE_BLOCK_SHIFT)
            | (u128::from(self.fs_block.0 & FS_BLOCK_MAX) << LENGTH_BITS)
            | u128::from(self.length & EXTENT_LEN_MAX);
        put_u64(out, 0, packed as u64);
        put_u64(out, 8, (packed >> 64) as u64);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let packed = u128::from(get_u64(raw, 0)) | (u128::from(get_u64(raw, 8)) << 64);
        let extent = Extent {
            unwritten: packed >> UNWRITTEN_BIT != 0,
            file_block: (packed >> FILE_BLOCK_SHIFT) as u64 & FILE_BLOCK_MAX,
            fs_block: FsBlock((packed >> LENGTH_BITS) as u64 & FS_BLOCK_MAX),
            length: packed as u32 & EXTENT_LEN_MAX,
        };
        extent.validate()?;
        Ok(extent)
    }
}

/// Decodes `count` packed extents from the front of `raw`, checking that they fit and are
/// sorted by logical block without overlap.
pub fn decode_extents(raw: &[u8], count: usize) -> Result<Vec<Extent>, FormatError> {
    let bytes = count.saturating_mul(Extent::SIZE);
    need(Extent::NAME, raw, bytes)?;
    let mut extents = Vec::with_capacity(count);
    let mut next_free = 0u64;
    for index in 0..count {
        let extent = Extent::decode(&raw[index * Extent::SIZE..])?;
        if extent.file_block < next_free {
            let why = "overlaps or precedes the previous extent";
            return Err(bad_field(
                Extent::NAME,
                NULL_BLOCK,
                "file_block",
                extent.file_block,
                why,
            ));
        }
        next_free = extent.file_end();
        extents.push(extent);
    }
    Ok(extents)
}

/// Encodes extents packed at the front of `out`; fails when they do not fit.
pub fn encode_extents(extents: &[Extent], out: &mut [u8]) -> Result<(), FormatError> {
    need(Extent::NAME, out, extents.len() * Extent::SIZE)?;
    for (index, extent) in extents.iter().enumerate() {
        extent.encode(&mut out[index * Extent::SIZE..]);
    }
    Ok(())
}

/// Key of the file extent tree: the first logical block of the subtree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BmapKey {
    pub file_block: u64,
}

impl OnDisk for BmapKey {
    const SIZE: usize = 8;
    const NAME: &'static str = "file extent tree key";

    fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.file_block);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let file_block = get_u64(raw, 0);
        if file_block > FILE_BLOCK_MAX {
            let why = "past FILE_BLOCK_MAX";
            return Err(bad_field(
                Self::NAME,
                NULL_BLOCK,
                "file_block",
                file_block,
                why,
            ));
        }
        Ok(Self { file_block })
    }
}

/// Pointer of the file extent tree: a filesystem block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BmapPointer {
    pub block: FsBlock,
}

impl OnDisk for BmapPointer {
    const SIZE: usize = 8;
    const NAME: &'static str = "file extent tree pointer";

    fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.block.0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let block = get_u64(raw, 0);
        if block > FS_BLOCK_MAX {
            return Err(bad_field(
                Self::NAME,
                NULL_BLOCK,
                "block",
                block,
                "past FS_BLOCK_MAX",
            ));
        }
        Ok(Self {
            block: FsBlock(block),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Checks the bit placement against a hand-packed value.
    #[test]
    fn bit_layout_is_as_documented() {
        let extent = Extent::new(1, FsBlock(2), 3, true).unwrap();
        let raw = extent.to_bytes();
        let low = get_u64(&raw, 0);
        let high = get_u64(&raw, 8);
        assert_eq!(low, 3 | (2 << 21));
        assert_eq!(high, (1 << (73 - 64)) | (1 << 63));
    }

    // Checks that out-of-range fields and overlapping lists are refused.
    #[test]
    fn bad_extents_are_refused() {
        assert!(Extent::new(0, FsBlock(0), 0, false).is_err());
        assert!(Extent::new(0, FsBlock(0), EXTENT_LEN_MAX + 1, false).is_err());
        assert!(Extent::new(FILE_BLOCK_MAX, FsBlock(0), 2, false).is_err());
        assert!(Extent::new(0, FsBlock(FS_BLOCK_MAX), 1, false).is_ok());
        assert!(Extent::new(0, FsBlock(FS_BLOCK_MAX + 1), 1, false).is_err());
        let a = Extent::new(0, FsBlock(10), 4, false).unwrap();
        let b = Extent::new(3, FsBlock(20), 4, false).unwrap();
        let mut raw = vec![0u8; 32];
        encode_extents(&[a, b], &mut raw).unwrap();
        assert!(decode_extents(&raw, 2).is_err());
        assert!(decode_extents(&raw, 3).is_err());
        assert!(encode_extents(&[a, b, a], &mut raw).is_err());
    }

    fn any_extent() -> impl Strategy<Value = Extent> {
        (
            0u64..=FILE_BLOCK_MAX - u64::from(EXTENT_LEN_MAX),
            0u64..=FS_BLOCK_MAX - (1 << 21),
        )
            .prop_flat_map(|(f, p)| (Just(f), Just(p), 1u32..=EXTENT_LEN_MAX, any::<bool>()))
            .prop_map(|(f, p, l, u)| Extent {
                file_block: f,
                fs_block: FsBlock(p),
                length: l,
                unwritten: u,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn extent_round_trip(extent in any_extent()) {
            prop_assert_eq!(Extent::decode(&extent.to_bytes()).unwrap(), extent);
        }

        #[test]
        fn extent_list_round_trip(mut list in proptest::collection::vec(any_extent(), 0..20)) {
            list.sort_by_key(|e| e.file_block);
            list.dedup_by(|b, a| b.file_block < a.file_end());
            let mut raw = vec![0u8; list.len() * 16];
            encode_extents(&list, &mut raw).unwrap();
            prop_assert_eq!(decode_extents(&raw, list.len()).unwrap(), list);
        }

        #[test]
        fn bmap_key_pointer_round_trip(
            block in 0u64..=FS_BLOCK_MAX, file_block in 0u64..=FILE_BLOCK_MAX,
        ) {
            let key = BmapKey { file_block };
            prop_assert_eq!(BmapKey::decode(&key.to_bytes()).unwrap(), key);
            let ptr = BmapPointer { block: FsBlock(block) };
            prop_assert_eq!(BmapPointer::decode(&ptr.to_bytes()).unwrap(), ptr);
        }

        #[test]
        fn extent_random_bytes_never_panic(
            raw in proptest::collection::vec(any::<u8>(), 0..200), count in 0usize..20,
        ) {
            let _ = Extent::decode(&raw);
            let _ = decode_extents(&raw, count);
            let _ = BmapKey::decode(&raw);
            let _ = BmapPointer::decode(&raw);
        }
    }
}
