//! The generic B+tree block: the node header every tree block carries after its `MetaHeader`,
//! the arithmetic that places records, keys and pointers in the body, and the fixed record and
//! key codecs of the per-AG trees.
//!
//! Header layout (72 bytes, little-endian):
//!
//! | offset | size | field        | meaning                                              |
//! |--------|------|--------------|------------------------------------------------------|
//! | 0      | 48   | header       | `MetaHeader`; magic names the tree kind              |
//! | 48     | 2    | level        | 0 for leaves, parent = child + 1                     |
//! | 50     | 2    | record_count | records (leaf) or keys/pointers (node) in use        |
//! | 52     | 4    | reserved     | zero                                                 |
//! | 56     | 8    | left         | left sibling at the same level, or `NULL_BLOCK`      |
//! | 64     | 8    | right        | right sibling at the same level, or `NULL_BLOCK`     |
//!
//! Body, from offset 72 to the end of the block:
//!
//! - leaf: `record_count` records of `record_size` bytes, packed, sorted by key;
//! - node: keys packed from offset 72, and pointers packed from offset
//!   `72 + node_capacity * key_size`, where `node_capacity = (block_size - 72) /
//!   (key_size + pointer_size)`. Pointer `i` leads to the subtree whose smallest key is key
//!   `i`. Placing pointers at a fixed offset lets a node grow without moving them.
//!
//! Sibling and child pointers are AG block numbers in the AG trees, filesystem blocks in the
//! file extent and attribute index trees, and filesystem blocks below 2^32 in the directory
//! hash tree.
//!
//! | tree               | kind       | record                  | key            | pointer |
//! |--------------------|------------|-------------------------|----------------|---------|
//! | free space by block| BnoBtree   | FreeSpaceRecord (8)     | BnoKey (4)     | 4       |
//! | free space by size | CntBtree   | FreeSpaceRecord (8)     | CntKey (8)     | 4       |
//! | inode chunks       | InoBtree   | InodeRecord (16)        | InoKey (4)     | 4       |
//! | free-inode chunks  | FinoBtree  | InodeRecord (16)        | InoKey (4)     | 4       |
//! | file extents       | BmapBtree  | Extent (16)             | BmapKey (8)    | 8       |
//! | directory hashes   | DirBtree   | DirHashRecord (8)       | DirHashKey (4) | 4       |
//! | xattr index        | AttrBtree  | XattrIndexRecord (16)   | XattrIndexKey (8) | 8    |
//! | shared blocks      | RefcountBtree | RefcountRecord (12)  | RefcountKey (4) | 4     |
//!
//! Free-space record (8 bytes): start AG block u32 @0, length u32 @4. By-block key: start u32.
//! By-length key (8 bytes): length u32 @0, start u32 @4.
//! Inode record (16 bytes): first AG inode of the 64-inode chunk u32 @0, free count u32 @4,
//! free mask u64 @8 (bit `i` set = inode `start + i` is free). Inode key: start u32.

use std::ops::Range;

use crate::FormatError;
use crate::geometry::Geometry;
use crate::header::{MetaHeader, MetaKind};
use crate::limits::{AG_BLOCKS_MAX, AG_HEADER_BLOCKS, BTREE_LEVELS_MAX, INODES_PER_CHUNK};
use crate::ondisk::put_u64;
use crate::ondisk::{OnDisk, bad_field, get_u16, get_u32, get_u64, need, put_u16, put_u32};
use crate::types::{AgBlock, NULL_BLOCK};

/// Size of `MetaHeader` plus the node header; records, keys and pointers start here.
pub const BTREE_HEADER_SIZE: usize = 72;

/// The decoded node header of a B+tree block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtreeHeader {
    pub header: MetaHeader,
    pub level: u16,
    pub record_count: u16,
    pub left: u64,
    pub right: u64,
}

impl OnDisk for BtreeHeader {
    const SIZE: usize = BTREE_HEADER_SIZE;
    const NAME: &'static str = "B+tree block header";

    fn encode(&self, out: &mut [u8]) {
        self.header.encode(out);
        put_u16(out, 48, self.level);
        put_u16(out, 50, self.record_count);
        put_u32(out, 52, 0);
        put_u64(out, 56, self.left);
        put_u64(out, 64, self.right);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let header = MetaHeader::decode(raw)?;
        let bad = |field, value: u64, why| bad_field(Self::NAME, header.blkno, field, value, why);
        let level = get_u16(raw, 48);
        if u32::from(level) >= BTREE_LEVELS_MAX {
            return Err(bad("level", level.into(), "deeper than BTREE_LEVELS_MAX"));
        }
        let reserved = get_u32(raw, 52);
        if reserved != 0 {
            return Err(bad("reserved", reserved.into(), "must be zero"));
        }
        Ok(Self {
            header,
            level,
            record_count: get_u16(raw, 50),
            left: get_u64(raw, 56),
            right: get_u64(raw, 64),
        })
    }
}

impl BtreeHeader {
    /// Structural check of a tree block against its layout: the magic matches the layout's
    /// kind, the count fits, siblings and (in nodes) child pointers lie in `valid` or are
    /// `NULL_BLOCK` (siblings only). `block` is the whole block.
    pub fn check(
        &self,
        layout: &BtreeLayout,
        block: &[u8],
        valid: Range<u64>,
    ) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u64, why| bad_field(Self::NAME, at, field, value, why);
        if self.header.magic != layout.kind.magic() {
            let why = "magic does not match the tree kind";
            return Err(bad("magic", self.header.magic.into(), why));
        }
        need(Self::NAME, block, layout.block_size as usize)?;
        if usize::from(self.record_count) > layout.capacity(self.level) {
            return Err(bad(
                "record_count",
                self.record_count.into(),
                "more than the block holds",
            ));
        }
        for (field, sibling) in [("left", self.left), ("right", self.right)] {
            if sibling != NULL_BLOCK && !valid.contains(&sibling) {
                return Err(bad(
                    field,
                    sibling,
                    "sibling outside the tree's address space",
                ));
            }
        }
        if self.left == self.right && self.left != NULL_BLOCK {
            return Err(bad("right", self.right, "same block as the left sibling"));
        }
        if self.level > 0 {
            for index in 0..usize::from(self.record_count) {
                let pointer = layout.pointer(block, index).unwrap_or(NULL_BLOCK);
                if !valid.contains(&pointer) {
                    return Err(bad(
                        "pointer",
                        pointer,
                        "child outside the tree's address space",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where records, keys and pointers sit in one kind of tree block of one block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtreeLayout {
    pub kind: MetaKind,
    pub block_size: u32,
    pub record_size: usize,
    pub key_size: usize,
    /// 4 or 8 bytes.
    pub pointer_size: usize,
}

impl BtreeLayout {
    /// The layout of a tree kind's blocks, or `None` for kinds that are not B+tree blocks.
    pub fn for_kind(kind: MetaKind, block_size: u32) -> Option<BtreeLayout> {
        let (record_size, key_size, pointer_size) = match kind {
            MetaKind::BnoBtree => (8, 4, 4),
            MetaKind::CntBtree => (8, 8, 4),
            MetaKind::InoBtree | MetaKind::FinoBtree => (16, 4, 4),
            MetaKind::BmapBtree => (16, 8, 8),
            MetaKind::DirBtree => (8, 4, 4),
            MetaKind::AttrBtree => (16, 8, 8),
            MetaKind::RefcountBtree => (12, 4, 4),
            _ => return None,
        };
        Some(BtreeLayout {
            kind,
            block_size,
            record_size,
            key_size,
            pointer_size,
        })
    }

    fn body_bytes(&self) -> usize {
        (self.block_size as usize).saturating_sub(BTREE_HEADER_SIZE)
    }

    /// Records a leaf holds.
    pub fn leaf_capacity(&self) -> usize {
        self.body_bytes() / self.record_size.max(1)
    }

    /// Key/pointer pairs a node holds.
    pub fn node_capacity(&self) -> usize {
        self.body_bytes() / (self.key_size + self.pointer_size).max(1)
    }

    /// Entries a block at `level` holds.
    pub fn capacity(&self, level: u16) -> usize {
        if level == 0 {
            self.leaf_capacity()
        } else {
            self.node_capacity()
        }
    }

    /// Byte range of record `index` in a leaf, if the leaf has such a slot.
    pub fn record_range(&self, index: usize) -> Option<Range<usize>> {
        let start = BTREE_HEADER_SIZE + index * self.record_size;
        (index < self.leaf_capacity()).then(|| start..start + self.record_size)
    }

    /// Byte range of key `index` in a node.
    pub fn key_range(&self, index: usize) -> Option<Range<usize>> {
        let start = BTREE_HEADER_SIZE + index * self.key_size;
        (index < self.node_capacity()).then(|| start..start + self.key_size)
    }

    /// Byte range of pointer `index` in a node; pointers start after `node_capacity` keys.
    pub fn pointer_range(&self, index: usize) -> Option<Range<usize>> {
        let base = BTREE_HEADER_SIZE + self.node_capacity() * self.key_size;
        let start = base + index * self.pointer_size;
        (index < self.node_capacity()).then(|| start..start + self.pointer_size)
    }

    pub fn record<'a>(&self, block: &'a [u8], index: usize) -> Option<&'a [u8]> {
        self.record_range(index).and_then(|r| block.get(r))
    }

    pub fn record_mut<'a>(&self, block: &'a mut [u8], index: usize) -> Option<&'a mut [u8]> {
        self.record_range(index).and_then(|r| block.get_mut(r))
    }

    pub fn key<'a>(&self, block: &'a [u8], index: usize) -> Option<&'a [u8]> {
        self.key_range(index).and_then(|r| block.get(r))
    }

    pub fn key_mut<'a>(&self, block: &'a mut [u8], index: usize) -> Option<&'a mut [u8]> {
        self.key_range(index).and_then(|r| block.get_mut(r))
    }

    /// Reads pointer `index` of a node as a number (4- or 8-byte field).
    pub fn pointer(&self, block: &[u8], index: usize) -> Option<u64> {
        let raw = self.pointer_range(index).and_then(|r| block.get(r))?;
        match self.pointer_size {
            4 => Some(u64::from(get_u32(raw, 0))),
            8 => Some(get_u64(raw, 0)),
            _ => None,
        }
    }

    /// Writes pointer `index` of a node; fails if there is no such slot or the value does not
    /// fit the pointer size.
    pub fn set_pointer(
        &self,
        block: &mut [u8],
        index: usize,
        value: u64,
    ) -> Result<(), FormatError> {
        let bad = |why| bad_field(BtreeHeader::NAME, NULL_BLOCK, "pointer", value, why);
        let raw = self
            .pointer_range(index)
            .and_then(|r| block.get_mut(r))
            .ok_or(bad("no such pointer slot"))?;
        match (self.pointer_size, u32::try_from(value)) {
            (4, Ok(narrow)) => put_u32(raw, 0, narrow),
            (8, _) => put_u64(raw, 0, value),
            _ => return Err(bad("does not fit the pointer size")),
        }
        Ok(())
    }

    /// The values sibling and child pointers may take in a block of this kind owned by `owner`
    /// (an AG number for AG trees, an inode number otherwise).
    pub fn pointer_bounds(&self, geometry: &Geometry, owner: u64) -> Range<u64> {
        match self.kind {
            MetaKind::BnoBtree
            | MetaKind::CntBtree
            | MetaKind::InoBtree
            | MetaKind::FinoBtree
            | MetaKind::RefcountBtree => match u32::try_from(owner) {
                Ok(ag) if ag < geometry.ag_count => {
                    u64::from(AG_HEADER_BLOCKS)..u64::from(geometry.ag_len(ag))
                }
                _ => 0..0,
            },
            MetaKind::BmapBtree | MetaKind::AttrBtree => {
                u64::from(AG_HEADER_BLOCKS)..geometry.block_count
            }
            _ => 0..1u64 << 32,
        }
    }
}

/// A free extent of an AG: the record of both free-space trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FreeSpaceRecord {
    pub start: AgBlock,
    pub length: u32,
}

impl FreeSpaceRecord {
    /// Checks the extent lies in the allocatable blocks of an AG of `ag_length` blocks.
    pub fn check(&self, block: u64, ag_length: u32) -> Result<(), FormatError> {
        let end = u64::from(self.start.0) + u64::from(self.length);
        if self.start.0 < AG_HEADER_BLOCKS || end > u64::from(ag_length) {
            let why = "extent outside the AG's allocatable blocks";
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
}

impl OnDisk for FreeSpaceRecord {
    const SIZE: usize = 8;
    const NAME: &'static str = "free-space record";

    #[inline]
    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.start.0);
        put_u32(out, 4, self.length);
    }

    #[inline]
    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let (start, length) = (get_u32(raw, 0), get_u32(raw, 4));
        if length == 0 {
            return Err(bad_field(
                Self::NAME,
                NULL_BLOCK,
                "length",
                0,
                "empty extent",
            ));
        }
        if u64::from(start) + u64::from(length) > u64::from(AG_BLOCKS_MAX) {
            let why = "extent ends past the largest AG";
            return Err(bad_field(
                Self::NAME,
                NULL_BLOCK,
                "start",
                start.into(),
                why,
            ));
        }
        Ok(Self {
            start: AgBlock(start),
            length,
        })
    }
}

/// Key of the by-block free-space tree: the extent's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BnoKey {
    pub start: AgBlock,
}

impl OnDisk for BnoKey {
    const SIZE: usize = 4;
    const NAME: &'static str = "free-space-by-block key";

    #[inline]
    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.start.0);
    }

    #[inline]
    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        Ok(Self {
            start: AgBlock(get_u32(raw, 0)),
        })
    }
}

/// Key of the by-length free-space tree: (length, start), so equal lengths sort by place.
/// Field order gives the derived ordering the tree uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CntKey {
    pub length: u32,
    pub start: AgBlock,
}

impl OnDisk for CntKey {
    const SIZE: usize = 8;
    const NAME: &'static str = "free-space-by-length key";

    #[inline]
    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.length);
        put_u32(out, 4, self.start.0);
    }

    #[inline]
    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        Ok(Self {
            length: get_u32(raw, 0),
            start: AgBlock(get_u32(raw, 4)),
        })
    }
}

/// A 64-inode chunk: the record of the inode and free-inode trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeRecord {
    /// First AG inode number of the chunk.
    pub start: u32,
    pub free_count: u32,
    /// Bit `i` set: inode `start + i` is free.
    pub free_mask: u64,
}

impl OnDisk for InodeRecord {
    const SIZE: usize = 16;
    const NAME: &'static str = "inode chunk record";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.start);
        put_u32(out, 4, self.free_count);
        put_u64(out, 8, self.free_mask);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let record = Self {
            start: get_u32(raw, 0),
            free_count: get_u32(raw, 4),
            free_mask: get_u64(raw, 8),
        };
        let bad = |field, value: u64, why| bad_field(Self::NAME, NULL_BLOCK, field, value, why);
        if record.start > u32::MAX - INODES_PER_CHUNK {
            return Err(bad(
                "start",
                record.start.into(),
                "chunk runs past the AG inode space",
            ));
        }
        if record.free_count != record.free_mask.count_ones() {
            return Err(bad(
                "free_count",
                record.free_count.into(),
                "disagrees with free_mask",
            ));
        }
        Ok(record)
    }
}

/// Key of the inode trees: the chunk's first AG inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct InoKey {
    pub start: u32,
}

impl OnDisk for InoKey {
    const SIZE: usize = 4;
    const NAME: &'static str = "inode tree key";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.start);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        Ok(Self {
            start: get_u32(raw, 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{UUID, sample_geometry};
    use proptest::prelude::*;

    fn leaf(kind: MetaKind, count: u16) -> BtreeHeader {
        BtreeHeader {
            header: MetaHeader::new(kind, 100, UUID, 0),
            level: 0,
            record_count: count,
            left: NULL_BLOCK,
            right: NULL_BLOCK,
        }
    }

    // Checks capacities and that pointers follow the largest possible key array.
    #[test]
    fn layout_arithmetic() {
        let layout = BtreeLayout::for_kind(MetaKind::BnoBtree, 4096).unwrap();
        assert_eq!(layout.leaf_capacity(), (4096 - 72) / 8);
        assert_eq!(layout.node_capacity(), (4096 - 72) / 8);
        let cap = layout.node_capacity();
        assert_eq!(layout.key_range(0), Some(72..76));
        assert_eq!(
            layout.pointer_range(0),
            Some(72 + cap * 4..72 + cap * 4 + 4)
        );
        assert!(layout.pointer_range(cap - 1).unwrap().end <= 4096);
        assert_eq!(layout.pointer_range(cap), None);
        assert_eq!(layout.record_range(layout.leaf_capacity()), None);
        for kind in MetaKind::ALL {
            if let Some(l) = BtreeLayout::for_kind(kind, 512) {
                assert!(l.leaf_capacity() >= 8 && l.node_capacity() >= 8, "{kind:?}");
                assert!(l.record_range(l.leaf_capacity() - 1).unwrap().end <= 512);
            }
        }
        assert_eq!(BtreeLayout::for_kind(MetaKind::Agf, 4096), None);
    }

    // Checks pointer reads and writes of both widths, and refusal of overwide values.
    #[test]
    fn pointers_of_both_widths() {
        let mut block = vec![0u8; 4096];
        let narrow = BtreeLayout::for_kind(MetaKind::InoBtree, 4096).unwrap();
        narrow.set_pointer(&mut block, 3, 1234).unwrap();
        assert_eq!(narrow.pointer(&block, 3), Some(1234));
        assert!(narrow.set_pointer(&mut block, 3, 1 << 40).is_err());
        let wide = BtreeLayout::for_kind(MetaKind::BmapBtree, 4096).unwrap();
        wide.set_pointer(&mut block, 5, 1 << 40).unwrap();
        assert_eq!(wide.pointer(&block, 5), Some(1 << 40));
        assert!(
            wide.set_pointer(&mut block, wide.node_capacity(), 1)
                .is_err()
        );
    }

    // Checks the structural verifier: counts, siblings, children and kind.
    #[test]
    fn check_refuses_bad_nodes() {
        let g = sample_geometry();
        let layout = BtreeLayout::for_kind(MetaKind::CntBtree, 4096).unwrap();
        let bounds = layout.pointer_bounds(&g, 1);
        assert_eq!(bounds, 4..65_536);
        let block = vec![0u8; 4096];
        assert!(
            leaf(MetaKind::CntBtree, 10)
                .check(&layout, &block, bounds.clone())
                .is_ok()
        );
        let too_many = leaf(MetaKind::CntBtree, 1000);
        assert!(too_many.check(&layout, &block, bounds.clone()).is_err());
        let wrong_kind = leaf(MetaKind::BnoBtree, 1);
        assert!(wrong_kind.check(&layout, &block, bounds.clone()).is_err());
        let sibling = BtreeHeader {
            left: 2,
            ..leaf(MetaKind::CntBtree, 1)
        };
        assert!(sibling.check(&layout, &block, bounds.clone()).is_err());
        let mut node_block = vec![0u8; 4096];
        let node = BtreeHeader {
            level: 1,
            ..leaf(MetaKind::CntBtree, 2)
        };
        layout.set_pointer(&mut node_block, 0, 10).unwrap();
        layout.set_pointer(&mut node_block, 1, 70_000).unwrap();
        assert!(node.check(&layout, &node_block, bounds.clone()).is_err());
        layout.set_pointer(&mut node_block, 1, 11).unwrap();
        assert!(node.check(&layout, &node_block, bounds).is_ok());
    }

    // Checks the record validators.
    #[test]
    fn records_validate() {
        assert!(FreeSpaceRecord::decode(&[0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        let rec = FreeSpaceRecord {
            start: AgBlock(8),
            length: 10,
        };
        assert!(rec.check(0, 17).is_err());
        assert!(rec.check(0, 18).is_ok());
        let ino = InodeRecord {
            start: 64,
            free_count: 2,
            free_mask: 0b1011,
        };
        assert!(InodeRecord::decode(&ino.to_bytes()).is_err());
        assert!(
            CntKey {
                length: 1,
                start: AgBlock(9)
            } < CntKey {
                length: 2,
                start: AgBlock(0)
            }
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn btree_header_round_trip(level in 0u16..12, count: u16, left: u64, right: u64, lsn: u64) {
            let mut header = MetaHeader::new(MetaKind::BmapBtree, 9, UUID, 99);
            header.lsn = crate::types::Lsn(lsn);
            let h = BtreeHeader { header, level, record_count: count, left, right };
            prop_assert_eq!(BtreeHeader::decode(&h.to_bytes()).unwrap(), h);
        }

        #[test]
        fn record_round_trips(
            start in 0u32..1 << 30, length in 1u32..1 << 30, mask: u64, key: u32,
        ) {
            let rec = FreeSpaceRecord { start: AgBlock(start), length };
            prop_assert_eq!(FreeSpaceRecord::decode(&rec.to_bytes()).unwrap(), rec);
            let cnt = CntKey { length, start: AgBlock(start) };
            prop_assert_eq!(CntKey::decode(&cnt.to_bytes()).unwrap(), cnt);
            let bno = BnoKey { start: AgBlock(key) };
            prop_assert_eq!(BnoKey::decode(&bno.to_bytes()).unwrap(), bno);
            let ino = InodeRecord { start, free_count: mask.count_ones(), free_mask: mask };
            prop_assert_eq!(InodeRecord::decode(&ino.to_bytes()).unwrap(), ino);
            let ikey = InoKey { start: key };
            prop_assert_eq!(InoKey::decode(&ikey.to_bytes()).unwrap(), ikey);
        }

        #[test]
        fn btree_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            let g = sample_geometry();
            if let Ok(h) = BtreeHeader::decode(&raw) {
                for kind in MetaKind::ALL {
                    if let Some(layout) = BtreeLayout::for_kind(kind, 512) {
                        let _ = h.check(&layout, &raw, layout.pointer_bounds(&g, h.header.owner));
                    }
                }
            }
            let _ = FreeSpaceRecord::decode(&raw);
            let _ = InodeRecord::decode(&raw);
            let _ = CntKey::decode(&raw);
        }
    }
}
