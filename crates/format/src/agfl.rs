//! The AG free list (AGFL): block 3 of every AG (owner = AG number). A small reserve of free
//! blocks that feeds free-space tree splits, so a split never has to re-enter the allocator.
//!
//! Layout (the whole block, little-endian):
//!
//! | offset     | size | field    | meaning                                            |
//! |------------|------|----------|----------------------------------------------------|
//! | 0          | 48   | header   | `MetaHeader`, magic "CFL1"                         |
//! | 48 + 4 * i | 4    | slot `i` | AG block number, or `NULL_AG_BLOCK` when unused    |
//!
//! The capacity is `(block_size - 48) / 4` slots; any bytes after the last slot are zero. Only
//! the slots the AGF names (from `free_list_first`, `free_list_count` of them, circularly) hold
//! list blocks; every other slot is `NULL_AG_BLOCK`, so a stray value is visible to fsck.

use crate::FormatError;
use crate::geometry::Geometry;
use crate::header::{Expected, HEADER_SIZE, MetaHeader, verify_header};
use crate::limits::{AG_AGFL_BLOCK, AG_HEADER_BLOCKS};
use crate::ondisk::{OnDisk, bad_field, get_u32, need, put_u32};
use crate::types::NULL_AG_BLOCK;

const NAME: &str = "AG free list";

/// Number of slots in the AGFL of a block of `block_size` bytes.
pub const fn agfl_capacity(block_size: u32) -> u32 {
    block_size.saturating_sub(HEADER_SIZE as u32) / 4
}

/// Byte offset of slot `slot` (for logging the dirty range of one slot).
pub const fn agfl_slot_offset(slot: u32) -> usize {
    HEADER_SIZE + 4 * slot as usize
}

/// Reads slot `slot` of an AGFL block, or `None` if the block has no such slot.
pub fn agfl_entry(block: &[u8], slot: u32) -> Option<u32> {
    let at = agfl_slot_offset(slot);
    (slot < agfl_capacity(block.len() as u32) && at + 4 <= block.len()).then(|| get_u32(block, at))
}

/// Writes slot `slot` of an AGFL block.
pub fn set_agfl_entry(block: &mut [u8], slot: u32, value: u32) -> Result<(), FormatError> {
    let capacity = agfl_capacity(block.len() as u32);
    if slot >= capacity || agfl_slot_offset(slot) + 4 > block.len() {
        let why = "slot past the AGFL capacity";
        return Err(bad_field(
            NAME,
            AG_AGFL_BLOCK.into(),
            "slot",
            u64::from(slot),
            why,
        ));
    }
    put_u32(block, agfl_slot_offset(slot), value);
    Ok(())
}

/// The decoded AGFL: header and every slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agfl {
    pub header: MetaHeader,
    /// All `agfl_capacity(block_size)` slots, unused ones `NULL_AG_BLOCK`.
    pub slots: Vec<u32>,
}

impl Agfl {
    /// An AGFL with every slot unused, for a block of `block_size` bytes.
    pub fn new(header: MetaHeader, block_size: u32) -> Agfl {
        Agfl {
            header,
            slots: vec![NULL_AG_BLOCK; agfl_capacity(block_size) as usize],
        }
    }

    /// Verifies the header against `expected`, then decodes and checks the slots.
    pub fn read(
        block: &[u8],
        expected: &Expected,
        geometry: &Geometry,
    ) -> Result<Agfl, FormatError> {
        verify_header(block, expected)?;
        need(NAME, block, geometry.block_size as usize)?;
        let agfl = Self::decode_block(&block[..geometry.block_size as usize])?;
        agfl.check(geometry)?;
        Ok(agfl)
    }

    /// Decodes a whole AGFL block; the slot count follows from the block's length.
    pub fn decode_block(block: &[u8]) -> Result<Agfl, FormatError> {
        need(NAME, block, HEADER_SIZE)?;
        let header = MetaHeader::decode(block)?;
        let capacity = agfl_capacity(block.len() as u32);
        let slots = (0..capacity)
            .map(|slot| get_u32(block, agfl_slot_offset(slot)))
            .collect();
        Ok(Agfl { header, slots })
    }

    /// Encodes into a whole block (`out.len()` is the block size); CRC is left to `stamp`.
    pub fn encode_block(&self, out: &mut [u8]) {
        debug_assert_eq!(self.slots.len() as u32, agfl_capacity(out.len() as u32));
        self.header.encode(out);
        let mut end = HEADER_SIZE;
        for (slot, value) in self.slots.iter().enumerate() {
            end = agfl_slot_offset(slot as u32) + 4;
            put_u32(out, end - 4, *value);
        }
        out[end..].fill(0);
    }

    /// Checks that the AG exists and every used slot names an allocatable block of it.
    pub fn check(&self, geometry: &Geometry) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let owner = self.header.owner;
        if owner >= u64::from(geometry.ag_count) {
            return Err(bad_field(
                NAME,
                at,
                "owner",
                owner,
                "no such allocation group",
            ));
        }
        let ag_length = geometry.ag_len(owner as u32);
        if self.slots.len() as u32 != agfl_capacity(geometry.block_size) {
            let count = self.slots.len() as u64;
            return Err(bad_field(
                NAME,
                at,
                "slots",
                count,
                "not the block's capacity",
            ));
        }
        for &value in &self.slots {
            if value != NULL_AG_BLOCK && (value < AG_HEADER_BLOCKS || value >= ag_length) {
                let why = "slot outside the AG's allocatable blocks";
                return Err(bad_field(NAME, at, "slot", u64::from(value), why));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{MetaKind, stamp};
    use crate::testing::{UUID, sample_geometry};
    use proptest::prelude::*;

    // Checks slot access at the edges of the capacity for several block sizes.
    #[test]
    fn slot_access_respects_capacity() {
        for block_size in [512u32, 4096, 65536] {
            let mut block = vec![0u8; block_size as usize];
            let cap = agfl_capacity(block_size);
            assert_eq!(cap, (block_size - 48) / 4);
            set_agfl_entry(&mut block, cap - 1, 77).unwrap();
            assert_eq!(agfl_entry(&block, cap - 1), Some(77));
            assert!(set_agfl_entry(&mut block, cap, 1).is_err());
            assert_eq!(agfl_entry(&block, cap), None);
        }
    }

    // Checks that a stamped AGFL reads back and that a stray slot value is refused.
    #[test]
    fn stamped_agfl_reads_back() {
        let g = sample_geometry();
        let header = MetaHeader::new(MetaKind::Agfl, g.ag_start(1) + 3, UUID, 1);
        let mut agfl = Agfl::new(header, g.block_size);
        agfl.slots[0] = 8;
        agfl.slots[1] = 9;
        let mut block = vec![0u8; g.block_size as usize];
        agfl.encode_block(&mut block);
        stamp(&mut block, None);
        let expected = Expected {
            kind: MetaKind::Agfl,
            blkno: header.blkno,
            uuid: UUID,
            owner: Some(1),
        };
        let mut read = Agfl::read(&block, &expected, &g).unwrap();
        read.header.crc = 0;
        assert_eq!(read, agfl);
        agfl.slots[2] = 2;
        assert!(matches!(
            agfl.check(&g),
            Err(FormatError::BadField { field: "slot", .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn agfl_round_trip(slots in proptest::collection::vec(any::<u32>(), 116), lsn: u64) {
            let mut header = MetaHeader::new(MetaKind::Agfl, 3, UUID, 0);
            header.lsn = crate::types::Lsn(lsn);
            let agfl = Agfl { header, slots };
            let mut block = vec![0u8; 512];
            agfl.encode_block(&mut block);
            prop_assert_eq!(Agfl::decode_block(&block).unwrap(), agfl);
        }

        #[test]
        fn agfl_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(agfl) = Agfl::decode_block(&raw) {
                let _ = agfl.check(&sample_geometry());
            }
            let _ = agfl_entry(&raw, 3);
        }
    }
}
