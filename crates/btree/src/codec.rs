//! Record and key codecs: what a tree stores and how it orders it.

use std::fmt::Debug;

use cairn_format::{
    BmapKey, BnoKey, CntKey, Extent, FreeSpaceRecord, InoKey, InodeRecord, MetaKind, OnDisk,
    RefcountKey, RefcountRecord,
};

/// A tree's record and key types. Both encode through the format crate's `OnDisk` codecs;
/// their sizes must match the layout of `KIND` (checked when a `TreeSpec` is made).
pub trait TreeCodec {
    type Record: OnDisk + Copy + Debug + PartialEq;
    type Key: OnDisk + Copy + Debug + Ord;
    /// The block kind (magic) of this tree's blocks.
    const KIND: MetaKind;

    /// The key a record sorts by.
    fn key(record: &Self::Record) -> Self::Key;
}

/// Free space by block number.
#[derive(Debug, Clone, Copy)]
pub struct BnoCodec;

impl TreeCodec for BnoCodec {
    type Record = FreeSpaceRecord;
    type Key = BnoKey;
    const KIND: MetaKind = MetaKind::BnoBtree;

    fn key(record: &FreeSpaceRecord) -> BnoKey {
        BnoKey {
            start: record.start,
        }
    }
}

/// Free space by length, then block number.
#[derive(Debug, Clone, Copy)]
pub struct CntCodec;

impl TreeCodec for CntCodec {
    type Record = FreeSpaceRecord;
    type Key = CntKey;
    const KIND: MetaKind = MetaKind::CntBtree;

    fn key(record: &FreeSpaceRecord) -> CntKey {
        CntKey {
            length: record.length,
            start: record.start,
        }
    }
}

/// Inode chunks by first inode.
#[derive(Debug, Clone, Copy)]
pub struct InoCodec;

impl TreeCodec for InoCodec {
    type Record = InodeRecord;
    type Key = InoKey;
    const KIND: MetaKind = MetaKind::InoBtree;

    fn key(record: &InodeRecord) -> InoKey {
        InoKey {
            start: record.start,
        }
    }
}

/// File extents by file block (8-byte pointers: filesystem blocks).
#[derive(Debug, Clone, Copy)]
pub struct BmapCodec;

impl TreeCodec for BmapCodec {
    type Record = Extent;
    type Key = BmapKey;
    const KIND: MetaKind = MetaKind::BmapBtree;

    fn key(record: &Extent) -> BmapKey {
        BmapKey {
            file_block: record.file_block,
        }
    }
}

/// Shared and copy-on-write staging blocks of an AG (reflink), by (staging, start).
#[derive(Debug, Clone, Copy)]
pub struct RefcountCodec;

impl TreeCodec for RefcountCodec {
    type Record = RefcountRecord;
    type Key = RefcountKey;
    const KIND: MetaKind = MetaKind::RefcountBtree;

    fn key(record: &RefcountRecord) -> RefcountKey {
        record.key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::{AgBlock, BtreeLayout};

    // Checks each codec's sizes against its kind's layout and the key orderings.
    #[test]
    fn codec_sizes_match_layouts() {
        fn sizes<C: TreeCodec>() -> (usize, usize, usize, usize) {
            let layout = BtreeLayout::for_kind(C::KIND, 4096).unwrap();
            (
                C::Record::SIZE,
                layout.record_size,
                C::Key::SIZE,
                layout.key_size,
            )
        }
        for (a, b, c, d) in [
            sizes::<BnoCodec>(),
            sizes::<CntCodec>(),
            sizes::<InoCodec>(),
            sizes::<BmapCodec>(),
            sizes::<RefcountCodec>(),
        ] {
            assert_eq!((a, c), (b, d));
        }
        let small = FreeSpaceRecord {
            start: AgBlock(50),
            length: 2,
        };
        let big = FreeSpaceRecord {
            start: AgBlock(10),
            length: 9,
        };
        assert!(CntCodec::key(&small) < CntCodec::key(&big));
        assert!(BnoCodec::key(&small) > BnoCodec::key(&big));
    }
}
