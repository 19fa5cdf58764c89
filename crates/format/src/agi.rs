//! The AG inode header (AGI): block 2 of every AG (owner = AG number). It holds the roots of
//! the inode tree (every allocated chunk) and the free-inode tree (chunks with a free inode),
//! the AG's inode counts, and the heads of the unlinked-inode hash.
//!
//! Layout (384 bytes, little-endian):
//!
//! | offset      | size | field        | meaning                                         |
//! |-------------|------|--------------|-------------------------------------------------|
//! | 0           | 48   | header       | `MetaHeader`, magic "CAI1"                      |
//! | 48          | 4    | ag_number    | this AG's index (equals the header owner)       |
//! | 52          | 4    | ag_length    | blocks in this AG                               |
//! | 56          | 4    | inode_count  | inodes in allocated chunks (multiple of 64)     |
//! | 60          | 4    | free_inodes  | free inodes among them                          |
//! | 64          | 4    | ino_root     | AG block of the inode tree root                 |
//! | 68          | 4    | ino_levels   | levels of the inode tree (1 = root is a leaf)   |
//! | 72          | 4    | fino_root    | AG block of the free-inode tree root            |
//! | 76          | 4    | fino_levels  | levels of the free-inode tree                   |
//! | 80          | 4    | newest_inode | first AG inode of the newest chunk, or NULL     |
//! | 84          | 4    | reserved     | zero                                            |
//! | 88 + 4 * i  | 4    | unlinked[i]  | head of unlinked bucket `i` (64), or NULL       |
//! | 344         | 40   | spare        | zero; reserved for growth                       |
//!
//! An AG inode number is `(ag_block << inodes_per_block_log) | slot`; NULL is
//! `NULL_AG_INODE`. An unlinked inode goes to bucket `ag_inode % 64`, and the bucket's list
//! continues through each inode's `next_unlinked` field.

use crate::FormatError;
use crate::agf::{check_levels, check_root};
use crate::geometry::Geometry;
use crate::header::{Expected, MetaHeader, verify_header};
use crate::limits::{
    AG_AGI_BLOCK, AG_BLOCKS_MAX, AG_BLOCKS_MIN, AG_HEADER_BLOCKS, AGI_UNLINKED_BUCKETS,
    INODES_PER_CHUNK,
};
use crate::ondisk::{OnDisk, bad_field, check_zero, get_u32, need, put_u32};
use crate::types::{AgBlock, AgNumber, NULL_AG_INODE};

const UNLINKED_OFFSET: usize = 88;
const SPARE_OFFSET: usize = UNLINKED_OFFSET + 4 * AGI_UNLINKED_BUCKETS;

/// The decoded AGI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agi {
    pub header: MetaHeader,
    pub ag_number: AgNumber,
    pub ag_length: u32,
    pub inode_count: u32,
    pub free_inodes: u32,
    pub ino_root: AgBlock,
    pub ino_levels: u32,
    pub fino_root: AgBlock,
    pub fino_levels: u32,
    pub newest_inode: u32,
    pub unlinked: [u32; AGI_UNLINKED_BUCKETS],
}

/// Whether `ag_inode` names an inode slot in an allocatable block of an AG of `ag_length`
/// blocks under `geometry`.
pub fn ag_inode_is_valid(geometry: &Geometry, ag_length: u32, ag_inode: u32) -> bool {
    let block = u64::from(ag_inode) >> geometry.inodes_per_block_log;
    block >= u64::from(AG_HEADER_BLOCKS) && block < u64::from(ag_length)
}

impl Agi {
    /// Verifies the header against `expected`, then decodes and checks the body.
    pub fn read(
        block: &[u8],
        expected: &Expected,
        geometry: &Geometry,
    ) -> Result<Agi, FormatError> {
        verify_header(block, expected)?;
        need(Self::NAME, block, geometry.block_size as usize)?;
        let agi = Self::decode(block)?;
        agi.check(geometry)?;
        let tail = Self::SIZE..geometry.block_size as usize;
        check_zero(Self::NAME, agi.header.blkno, "block tail", block, tail)?;
        Ok(agi)
    }

    /// Checks the fields that depend on the geometry: the AG, its length, the header's block,
    /// and that every inode number named is a slot of this AG.
    pub fn check(&self, geometry: &Geometry) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u32, why| bad_field(Self::NAME, at, field, u64::from(value), why);
        let ag = self.ag_number.0;
        if ag >= geometry.ag_count {
            return Err(bad("ag_number", ag, "no such allocation group"));
        }
        if self.ag_length != geometry.ag_len(ag) {
            return Err(bad(
                "ag_length",
                self.ag_length,
                "disagrees with the geometry",
            ));
        }
        if at != geometry.ag_start(ag) + u64::from(AG_AGI_BLOCK) {
            return Err(bad_field(
                Self::NAME,
                at,
                "blkno",
                at,
                "not the AG's AGI block",
            ));
        }
        let valid = |ino| ino == NULL_AG_INODE || ag_inode_is_valid(geometry, self.ag_length, ino);
        if !valid(self.newest_inode) {
            return Err(bad(
                "newest_inode",
                self.newest_inode,
                "not an inode of this AG",
            ));
        }
        if self.newest_inode != NULL_AG_INODE && !self.newest_inode.is_multiple_of(INODES_PER_CHUNK)
        {
            return Err(bad(
                "newest_inode",
                self.newest_inode,
                "not the first inode of a chunk",
            ));
        }
        if (self.newest_inode == NULL_AG_INODE) != (self.inode_count == 0) {
            return Err(bad(
                "newest_inode",
                self.newest_inode,
                "null exactly when the AG has no chunks",
            ));
        }
        for &head in &self.unlinked {
            if !valid(head) {
                return Err(bad("unlinked", head, "not an inode of this AG"));
            }
        }
        Ok(())
    }

    fn check_body(&self) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u32, why| bad_field(Self::NAME, at, field, u64::from(value), why);
        if !(AG_BLOCKS_MIN..=AG_BLOCKS_MAX).contains(&self.ag_length) {
            return Err(bad(
                "ag_length",
                self.ag_length,
                "outside the allowed AG size range",
            ));
        }
        if self.header.owner != u64::from(self.ag_number.0) {
            let owner = self.header.owner;
            return Err(bad_field(
                Self::NAME,
                at,
                "owner",
                owner,
                "differs from ag_number",
            ));
        }
        check_root(Self::NAME, at, ("ino_root", self.ino_root), self.ag_length)?;
        check_root(
            Self::NAME,
            at,
            ("fino_root", self.fino_root),
            self.ag_length,
        )?;
        check_levels(Self::NAME, at, "ino_levels", self.ino_levels)?;
        check_levels(Self::NAME, at, "fino_levels", self.fino_levels)?;
        if !self.inode_count.is_multiple_of(INODES_PER_CHUNK) {
            return Err(bad(
                "inode_count",
                self.inode_count,
                "not a whole number of chunks",
            ));
        }
        if self.free_inodes > self.inode_count {
            return Err(bad(
                "free_inodes",
                self.free_inodes,
                "more than inode_count",
            ));
        }
        for (bucket, &head) in self.unlinked.iter().enumerate() {
            if head != NULL_AG_INODE && head as usize % AGI_UNLINKED_BUCKETS != bucket {
                return Err(bad("unlinked", head, "inode hashed to another bucket"));
            }
        }
        Ok(())
    }
}

impl OnDisk for Agi {
    const SIZE: usize = 384;
    const NAME: &'static str = "AG inode header";

    fn encode(&self, out: &mut [u8]) {
        self.header.encode(out);
        put_u32(out, 48, self.ag_number.0);
        put_u32(out, 52, self.ag_length);
        put_u32(out, 56, self.inode_count);
        put_u32(out, 60, self.free_inodes);
        put_u32(out, 64, self.ino_root.0);
        put_u32(out, 68, self.ino_levels);
        put_u32(out, 72, self.fino_root.0);
        put_u32(out, 76, self.fino_levels);
        put_u32(out, 80, self.newest_inode);
        put_u32(out, 84, 0);
        for (bucket, &head) in self.unlinked.iter().enumerate() {
            put_u32(out, UNLINKED_OFFSET + 4 * bucket, head);
        }
        out[SPARE_OFFSET..Self::SIZE].fill(0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let mut unlinked = [NULL_AG_INODE; AGI_UNLINKED_BUCKETS];
        for (bucket, head) in unlinked.iter_mut().enumerate() {
            *head = get_u32(raw, UNLINKED_OFFSET + 4 * bucket);
        }
        let agi = Self {
            header: MetaHeader::decode(raw)?,
            ag_number: AgNumber(get_u32(raw, 48)),
            ag_length: get_u32(raw, 52),
            inode_count: get_u32(raw, 56),
            free_inodes: get_u32(raw, 60),
            ino_root: AgBlock(get_u32(raw, 64)),
            ino_levels: get_u32(raw, 68),
            fino_root: AgBlock(get_u32(raw, 72)),
            fino_levels: get_u32(raw, 76),
            newest_inode: get_u32(raw, 80),
            unlinked,
        };
        check_zero(Self::NAME, agi.header.blkno, "reserved", raw, 84..88)?;
        check_zero(
            Self::NAME,
            agi.header.blkno,
            "spare",
            raw,
            SPARE_OFFSET..Self::SIZE,
        )?;
        agi.check_body()?;
        Ok(agi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{MetaKind, stamp};
    use crate::testing::{UUID, sample_geometry};
    use proptest::prelude::*;

    fn sample(ag: u32) -> Agi {
        let g = sample_geometry();
        Agi {
            header: MetaHeader::new(MetaKind::Agi, g.ag_start(ag) + 2, UUID, u64::from(ag)),
            ag_number: AgNumber(ag),
            ag_length: g.ag_len(ag),
            inode_count: 64,
            free_inodes: 61,
            ino_root: AgBlock(6),
            ino_levels: 1,
            fino_root: AgBlock(7),
            fino_levels: 1,
            newest_inode: 64,
            unlinked: [NULL_AG_INODE; AGI_UNLINKED_BUCKETS],
        }
    }

    // Checks that a stamped AGI written by the codec reads back through `Agi::read`.
    #[test]
    fn stamped_agi_reads_back() {
        let g = sample_geometry();
        let mut agi = sample(3);
        agi.unlinked[5] = 64 + 5;
        let mut block = vec![0u8; g.block_size as usize];
        agi.encode(&mut block);
        stamp(&mut block, None);
        let expected = Expected {
            kind: MetaKind::Agi,
            blkno: agi.header.blkno,
            uuid: UUID,
            owner: Some(3),
        };
        let mut read = Agi::read(&block, &expected, &g).unwrap();
        read.header.crc = 0;
        assert_eq!(read, agi);
    }

    // Checks that each inconsistent field is refused and named.
    #[test]
    fn inconsistent_fields_are_named() {
        let g = sample_geometry();
        let field_of = |agi: Agi| match Agi::decode(&agi.to_bytes()).and_then(|a| a.check(&g)) {
            Err(FormatError::BadField { field, .. }) => field,
            other => panic!("accepted or wrong error: {other:?}"),
        };
        assert_eq!(
            field_of(Agi {
                inode_count: 65,
                ..sample(0)
            }),
            "inode_count"
        );
        assert_eq!(
            field_of(Agi {
                free_inodes: 65,
                ..sample(0)
            }),
            "free_inodes"
        );
        assert_eq!(
            field_of(Agi {
                fino_root: AgBlock(1),
                ..sample(0)
            }),
            "fino_root"
        );
        assert_eq!(
            field_of(Agi {
                ino_levels: 13,
                ..sample(0)
            }),
            "ino_levels"
        );
        assert_eq!(
            field_of(Agi {
                newest_inode: 3,
                ..sample(0)
            }),
            "newest_inode"
        );
        let mut wrong_bucket = sample(0);
        wrong_bucket.unlinked[1] = 64;
        assert_eq!(field_of(wrong_bucket), "unlinked");
    }

    // Checks the newest_inode rules (a chunk's first inode; NULL exactly when there are no
    // chunks) and that the reserved and spare bytes must be zero.
    #[test]
    fn newest_inode_and_reserved_bytes() {
        let g = sample_geometry();
        let refused = |agi: Agi| {
            Agi::decode(&agi.to_bytes())
                .and_then(|a| a.check(&g))
                .is_err()
        };
        assert!(refused(Agi {
            newest_inode: 64 + 8,
            ..sample(0)
        }));
        assert!(refused(Agi {
            newest_inode: NULL_AG_INODE,
            ..sample(0)
        }));
        assert!(refused(Agi {
            inode_count: 0,
            free_inodes: 0,
            ..sample(0)
        }));
        for at in [84, 350, 383] {
            let mut raw = sample(0).to_bytes();
            raw[at] = 1;
            assert!(Agi::decode(&raw).is_err(), "byte {at} accepted");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn agi_round_trip(
            ag in 0u32..4, chunks in 0u32..1000, free: u32, root in 4u32..65_536,
            levels in 1u32..=12, newest: u32, heads in proptest::collection::vec(any::<u32>(), 64),
            lsn: u64,
        ) {
            let mut agi = sample(ag);
            agi.header.lsn = crate::types::Lsn(lsn);
            agi.inode_count = chunks * 64;
            agi.free_inodes = free % (agi.inode_count + 1);
            agi.ino_root = AgBlock(root);
            agi.fino_root = AgBlock(65_539 - root);
            agi.ino_levels = levels;
            agi.newest_inode = newest;
            for (bucket, head) in heads.into_iter().enumerate() {
                let ino = (head / 64) * 64 + bucket as u32;
                agi.unlinked[bucket] = if head % 3 == 0 { NULL_AG_INODE } else { ino };
            }
            prop_assert_eq!(Agi::decode(&agi.to_bytes()).unwrap(), agi);
        }

        #[test]
        fn agi_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(agi) = Agi::decode(&raw) {
                let _ = agi.check(&sample_geometry());
            }
        }
    }
}
