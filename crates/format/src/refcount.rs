//! The reference-count tree of an AG (reflink, superblock feature `FEATURE_INCOMPAT_REFLINK`):
//! which blocks more than one file maps, and which blocks are copy-on-write staging.
//!
//! A block mapped by exactly one file has no record (its count of 1 is implied); a record
//! names a run of blocks that `refcount` (>= 2) file mappings share, or a run of blocks
//! allocated for a copy-on-write that no file maps yet (a *staging* record, refcount 1). Mount
//! frees staging blocks a crash left (their data never reached a file map); fsck reports
//! and repair removes them.
//!
//! Record (12 bytes, little-endian), by key:
//!
//! | offset | size | field    | meaning                                                  |
//! |--------|------|----------|----------------------------------------------------------|
//! | 0      | 4    | start    | AG block; bit 31 set: a staging record (`STAGING_BIT`)   |
//! | 4      | 4    | length   | blocks, >= 1, the run ends inside the largest AG         |
//! | 8      | 4    | refcount | >= 2 for shared runs, exactly 1 for staging runs         |
//!
//! Key (4 bytes): the record's first word (start with the staging bit), so every shared
//! record sorts before every staging record and each group sorts by start. Pointers are AG
//! blocks (4 bytes). Records of one group never overlap; neighbours of equal count that
//! touch are merged.

use crate::FormatError;
use crate::limits::AG_BLOCKS_MAX;
use crate::ondisk::{OnDisk, bad_field, get_u32, need, put_u32};
use crate::types::{AgBlock, NULL_BLOCK};

/// Bit of the record's first word that marks a staging record (AG blocks use 31 bits).
pub const STAGING_BIT: u32 = 1 << 31;

/// One run of shared or staging blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefcountRecord {
    pub start: AgBlock,
    pub length: u32,
    /// File mappings of each block of the run (1 for staging runs).
    pub refcount: u32,
    /// Blocks allocated for a copy-on-write not yet in any file map.
    pub staging: bool,
}

impl RefcountRecord {
    /// One past the run's last AG block.
    pub fn end(&self) -> u64 {
        u64::from(self.start.0) + u64::from(self.length)
    }

    /// Checks the run lies in the allocatable blocks of an AG of `ag_length` blocks.
    pub fn check(&self, block: u64, ag_length: u32) -> Result<(), FormatError> {
        let end = self.end();
        if self.start.0 < crate::limits::AG_HEADER_BLOCKS || end > u64::from(ag_length) {
            let why = "run outside the AG's allocatable blocks";
            return Err(bad_field(
                Self::NAME,
                block,
                "start",
                self.start.0.into(),
                why,
            ));
        }
        Ok(())
    }

    pub fn key(&self) -> RefcountKey {
        RefcountKey {
            staging: self.staging,
            start: self.start,
        }
    }
}

impl OnDisk for RefcountRecord {
    const SIZE: usize = 12;
    const NAME: &'static str = "refcount record";

    fn encode(&self, out: &mut [u8]) {
        self.key().encode(out);
        put_u32(out, 4, self.length);
        put_u32(out, 8, self.refcount);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let key = RefcountKey::decode(raw)?;
        let (length, refcount) = (get_u32(raw, 4), get_u32(raw, 8));
        let bad =
            |field, value: u32, why| bad_field(Self::NAME, NULL_BLOCK, field, value.into(), why);
        if length == 0 {
            return Err(bad("length", 0, "empty run"));
        }
        if u64::from(key.start.0) + u64::from(length) > u64::from(AG_BLOCKS_MAX) {
            return Err(bad("start", key.start.0, "run ends past the largest AG"));
        }
        match (key.staging, refcount) {
            (true, 1) | (false, 2..) => {}
            (true, _) => return Err(bad("refcount", refcount, "a staging run counts 1")),
            (false, _) => return Err(bad("refcount", refcount, "a shared run counts 2 or more")),
        }
        Ok(Self {
            start: key.start,
            length,
            refcount,
            staging: key.staging,
        })
    }
}

/// Key of the refcount tree: staging runs after shared ones, each group by start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RefcountKey {
    pub staging: bool,
    pub start: AgBlock,
}

impl OnDisk for RefcountKey {
    const SIZE: usize = 4;
    const NAME: &'static str = "refcount key";

    fn encode(&self, out: &mut [u8]) {
        let bit = if self.staging { STAGING_BIT } else { 0 };
        put_u32(out, 0, self.start.0 | bit);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let word = get_u32(raw, 0);
        Ok(Self {
            staging: word & STAGING_BIT != 0,
            start: AgBlock(word & !STAGING_BIT),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Checks the refusals: empty runs, runs past the largest AG, counts that do not fit the
    // record's kind; and that staging keys sort after every shared key.
    #[test]
    fn refcount_records_validate() {
        let shared = RefcountRecord {
            start: AgBlock(100),
            length: 8,
            refcount: 2,
            staging: false,
        };
        assert!(RefcountRecord::decode(&shared.to_bytes()).is_ok());
        for bad in [
            RefcountRecord {
                length: 0,
                ..shared
            },
            RefcountRecord {
                refcount: 1,
                ..shared
            },
            RefcountRecord {
                refcount: 2,
                staging: true,
                ..shared
            },
            RefcountRecord {
                start: AgBlock(AG_BLOCKS_MAX - 4),
                ..shared
            },
        ] {
            assert!(RefcountRecord::decode(&bad.to_bytes()).is_err(), "{bad:?}");
        }
        assert!(shared.check(0, 108).is_ok());
        assert!(shared.check(0, 107).is_err());
        let staging = RefcountKey {
            staging: true,
            start: AgBlock(4),
        };
        assert!(shared.key() < staging);
        assert_eq!(staging.to_bytes()[3] & 0x80, 0x80);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn refcount_record_round_trip(
            start in 4u32..1 << 30, length in 1u32..1 << 30, refcount in 2u32.., staging: bool,
        ) {
            let record = RefcountRecord {
                start: AgBlock(start),
                length,
                refcount: if staging { 1 } else { refcount },
                staging,
            };
            prop_assert_eq!(RefcountRecord::decode(&record.to_bytes()).unwrap(), record);
            let key = record.key();
            prop_assert_eq!(RefcountKey::decode(&key.to_bytes()).unwrap(), key);
        }

        #[test]
        fn refcount_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = RefcountRecord::decode(&raw);
            let _ = RefcountKey::decode(&raw);
        }
    }
}
