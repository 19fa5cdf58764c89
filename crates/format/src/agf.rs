//! The AG free-space header (AGF): block 1 of every AG (owner = AG number). It holds the roots
//! of the two free-space trees, the AG's free-space summary, and the bounds of the AG free list
//! (a circular list of blocks kept in the AGFL, reserved to feed tree splits).
//!
//! Layout (128 bytes, little-endian):
//!
//! | offset | size | field            | meaning                                           |
//! |--------|------|------------------|---------------------------------------------------|
//! | 0      | 48   | header           | `MetaHeader`, magic "CAF1"                        |
//! | 48     | 4    | ag_number        | this AG's index (equals the header owner)         |
//! | 52     | 4    | ag_length        | blocks in this AG (the last AG may be shorter)    |
//! | 56     | 4    | bno_root         | AG block of the by-block free-space tree root     |
//! | 60     | 4    | bno_levels       | levels of that tree (1 = the root is a leaf)      |
//! | 64     | 4    | cnt_root         | AG block of the by-length free-space tree root    |
//! | 68     | 4    | cnt_levels       | levels of that tree                               |
//! | 72     | 4    | free_blocks      | free blocks in the trees (not counting the AGFL)  |
//! | 76     | 4    | longest_free     | length of the longest free extent                 |
//! | 80     | 4    | btree_blocks     | blocks used by both free-space trees, less roots  |
//! | 84     | 4    | free_list_first  | AGFL slot of the first free-list block            |
//! | 88     | 4    | free_list_last   | AGFL slot of the last free-list block             |
//! | 92     | 4    | free_list_count  | blocks on the free list                           |
//! | 96     | 4    | refcount_root    | AG block of the refcount tree root, 0 = no tree   |
//! | 100    | 4    | refcount_levels  | levels of that tree, 0 = no tree                  |
//! | 104    | 4    | refcount_blocks  | blocks of that tree, root included                |
//! | 108    | 20   | spare            | zero; reserved for growth                         |
//!
//! The refcount fields are used with the reflink feature (`superblock.rs`); without it, and
//! until the first block of the AG is shared, all three are zero: the tree's root is made
//! when its first record is (`docs/format.md`, section 6).
//!
//! The free list is circular over the AGFL's slots: it holds `free_list_count` blocks from
//! slot `free_list_first` onwards, wrapping at the AGFL capacity, ending at `free_list_last`.
//! So `(first + count) % capacity == (last + 1) % capacity` always; an empty list has
//! `last == first - 1` (mod capacity).

use crate::FormatError;
use crate::agfl::agfl_capacity;
use crate::geometry::Geometry;
use crate::header::{Expected, MetaHeader, verify_header};
use crate::limits::BTREE_LEVELS_MAX;
use crate::limits::{AG_AGF_BLOCK, AG_BLOCKS_MAX, AG_BLOCKS_MIN, AG_HEADER_BLOCKS};
use crate::ondisk::{OnDisk, bad_field, check_zero, get_u32, need, put_u32};
use crate::types::{AgBlock, AgNumber};

/// The decoded AGF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agf {
    pub header: MetaHeader,
    pub ag_number: AgNumber,
    pub ag_length: u32,
    pub bno_root: AgBlock,
    pub bno_levels: u32,
    pub cnt_root: AgBlock,
    pub cnt_levels: u32,
    pub free_blocks: u32,
    pub longest_free: u32,
    pub btree_blocks: u32,
    pub free_list_first: u32,
    pub free_list_last: u32,
    pub free_list_count: u32,
    /// Root of the refcount tree (`refcount.rs`), 0 while the AG has none.
    pub refcount_root: AgBlock,
    /// Levels of that tree, 0 while the AG has none.
    pub refcount_levels: u32,
    /// Blocks of that tree, its root included.
    pub refcount_blocks: u32,
}

impl Agf {
    /// Verifies the header against `expected`, then decodes and checks the body.
    pub fn read(
        block: &[u8],
        expected: &Expected,
        geometry: &Geometry,
    ) -> Result<Agf, FormatError> {
        verify_header(block, expected)?;
        need(Self::NAME, block, geometry.block_size as usize)?;
        let agf = Self::decode(block)?;
        agf.check(geometry)?;
        let tail = Self::SIZE..geometry.block_size as usize;
        check_zero(Self::NAME, agf.header.blkno, "block tail", block, tail)?;
        Ok(agf)
    }

    /// Checks the fields that depend on the geometry: the AG exists, its length is the
    /// geometry's, the header sits at the AG's AGF block, and the free-list bounds fit the AGFL.
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
        if at != geometry.ag_start(ag) + u64::from(AG_AGF_BLOCK) {
            return Err(bad_field(
                Self::NAME,
                at,
                "blkno",
                at,
                "not the AG's AGF block",
            ));
        }
        check_free_list(
            Self::NAME,
            at,
            agfl_capacity(geometry.block_size),
            self.free_list_first,
            self.free_list_last,
            self.free_list_count,
        )
    }

    /// The AGFL slots that hold free-list blocks, in list order.
    pub fn free_list_slots(&self, capacity: u32) -> impl Iterator<Item = u32> + use<> {
        let first = self.free_list_first;
        let count = if capacity == 0 {
            0
        } else {
            self.free_list_count.min(capacity)
        };
        (0..count).map(move |i| ((u64::from(first) + u64::from(i)) % u64::from(capacity)) as u32)
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
        check_root(Self::NAME, at, ("bno_root", self.bno_root), self.ag_length)?;
        check_root(Self::NAME, at, ("cnt_root", self.cnt_root), self.ag_length)?;
        check_levels(Self::NAME, at, "bno_levels", self.bno_levels)?;
        check_levels(Self::NAME, at, "cnt_levels", self.cnt_levels)?;
        if self.free_blocks > self.ag_length - AG_HEADER_BLOCKS {
            return Err(bad(
                "free_blocks",
                self.free_blocks,
                "more than the AG holds",
            ));
        }
        if self.longest_free > self.free_blocks {
            return Err(bad(
                "longest_free",
                self.longest_free,
                "more than free_blocks",
            ));
        }
        if self.btree_blocks > self.ag_length {
            return Err(bad(
                "btree_blocks",
                self.btree_blocks,
                "more than the AG holds",
            ));
        }
        self.check_refcount_root()
    }

    /// The refcount tree's fields: all zero (no tree), or a valid root and height with at
    /// least the root counted.
    fn check_refcount_root(&self) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u32, why| bad_field(Self::NAME, at, field, u64::from(value), why);
        if self.refcount_levels == 0 {
            if self.refcount_root.0 != 0 {
                return Err(bad(
                    "refcount_root",
                    self.refcount_root.0,
                    "set without a tree",
                ));
            }
            if self.refcount_blocks != 0 {
                let why = "blocks counted without a tree";
                return Err(bad("refcount_blocks", self.refcount_blocks, why));
            }
            return Ok(());
        }
        let root = ("refcount_root", self.refcount_root);
        check_root(Self::NAME, at, root, self.ag_length)?;
        check_levels(Self::NAME, at, "refcount_levels", self.refcount_levels)?;
        if self.refcount_blocks < self.refcount_levels || self.refcount_blocks > self.ag_length {
            let why = "fewer than its levels or more than the AG holds";
            return Err(bad("refcount_blocks", self.refcount_blocks, why));
        }
        Ok(())
    }

    /// Whether the AG has a refcount tree.
    pub fn has_refcount_tree(&self) -> bool {
        self.refcount_levels != 0
    }
}

/// Checks that a tree root is a dynamically allocated block inside an AG of `ag_length`.
pub(crate) fn check_root(
    structure: &'static str,
    at: u64,
    (field, root): (&'static str, AgBlock),
    ag_length: u32,
) -> Result<(), FormatError> {
    if root.0 < AG_HEADER_BLOCKS || root.0 >= ag_length {
        let why = "tree root outside the AG's allocatable blocks";
        return Err(bad_field(structure, at, field, u64::from(root.0), why));
    }
    Ok(())
}

/// Checks a tree height: at least one level, at most `BTREE_LEVELS_MAX`.
pub(crate) fn check_levels(
    structure: &'static str,
    at: u64,
    field: &'static str,
    levels: u32,
) -> Result<(), FormatError> {
    if !(1..=BTREE_LEVELS_MAX).contains(&levels) {
        let why = "tree height outside 1..=BTREE_LEVELS_MAX";
        return Err(bad_field(structure, at, field, u64::from(levels), why));
    }
    Ok(())
}

/// Checks circular free-list bounds against an AGFL of `capacity` slots.
fn check_free_list(
    structure: &'static str,
    at: u64,
    capacity: u32,
    first: u32,
    last: u32,
    count: u32,
) -> Result<(), FormatError> {
    let bad = |field, value: u32, why| bad_field(structure, at, field, u64::from(value), why);
    if first >= capacity {
        return Err(bad("free_list_first", first, "past the AGFL capacity"));
    }
    if last >= capacity {
        return Err(bad("free_list_last", last, "past the AGFL capacity"));
    }
    if count > capacity {
        return Err(bad("free_list_count", count, "more than the AGFL holds"));
    }
    // All three are below `capacity` <= 2^14 here, so the sums cannot overflow.
    if (first + count) % capacity != (last + 1) % capacity {
        return Err(bad(
            "free_list_count",
            count,
            "disagrees with first and last",
        ));
    }
    Ok(())
}

impl OnDisk for Agf {
    const SIZE: usize = 128;
    const NAME: &'static str = "AG free-space header";

    fn encode(&self, out: &mut [u8]) {
        self.header.encode(out);
        put_u32(out, 48, self.ag_number.0);
        put_u32(out, 52, self.ag_length);
        put_u32(out, 56, self.bno_root.0);
        put_u32(out, 60, self.bno_levels);
        put_u32(out, 64, self.cnt_root.0);
        put_u32(out, 68, self.cnt_levels);
        put_u32(out, 72, self.free_blocks);
        put_u32(out, 76, self.longest_free);
        put_u32(out, 80, self.btree_blocks);
        put_u32(out, 84, self.free_list_first);
        put_u32(out, 88, self.free_list_last);
        put_u32(out, 92, self.free_list_count);
        put_u32(out, 96, self.refcount_root.0);
        put_u32(out, 100, self.refcount_levels);
        put_u32(out, 104, self.refcount_blocks);
        out[108..Self::SIZE].fill(0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let agf = Self {
            header: MetaHeader::decode(raw)?,
            ag_number: AgNumber(get_u32(raw, 48)),
            ag_length: get_u32(raw, 52),
            bno_root: AgBlock(get_u32(raw, 56)),
            bno_levels: get_u32(raw, 60),
            cnt_root: AgBlock(get_u32(raw, 64)),
            cnt_levels: get_u32(raw, 68),
            free_blocks: get_u32(raw, 72),
            longest_free: get_u32(raw, 76),
            btree_blocks: get_u32(raw, 80),
            free_list_first: get_u32(raw, 84),
            free_list_last: get_u32(raw, 88),
            free_list_count: get_u32(raw, 92),
            refcount_root: AgBlock(get_u32(raw, 96)),
            refcount_levels: get_u32(raw, 100),
            refcount_blocks: get_u32(raw, 104),
        };
        check_zero(Self::NAME, agf.header.blkno, "spare", raw, 108..Self::SIZE)?;
        agf.check_body()?;
        Ok(agf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{MetaKind, stamp};
    use crate::testing::{UUID, sample_geometry};
    use proptest::prelude::*;

    fn sample(ag: u32) -> Agf {
        let g = sample_geometry();
        let capacity = agfl_capacity(g.block_size);
        Agf {
            header: MetaHeader::new(MetaKind::Agf, g.ag_start(ag) + 1, UUID, u64::from(ag)),
            ag_number: AgNumber(ag),
            ag_length: g.ag_len(ag),
            bno_root: AgBlock(4),
            bno_levels: 1,
            cnt_root: AgBlock(5),
            cnt_levels: 1,
            free_blocks: g.ag_len(ag) - 12,
            longest_free: g.ag_len(ag) - 12,
            btree_blocks: 0,
            free_list_first: 0,
            free_list_last: 3,
            free_list_count: 4.min(capacity),
            refcount_root: AgBlock(0),
            refcount_levels: 0,
            refcount_blocks: 0,
        }
    }

    // Checks that a stamped AGF written by the codec reads back through `Agf::read`.
    #[test]
    fn stamped_agf_reads_back() {
        let g = sample_geometry();
        let agf = sample(2);
        let mut block = vec![0u8; g.block_size as usize];
        agf.encode(&mut block);
        stamp(&mut block, None);
        let expected = Expected {
            kind: MetaKind::Agf,
            blkno: g.ag_start(2) + 1,
            uuid: UUID,
            owner: Some(2),
        };
        let mut read = Agf::read(&block, &expected, &g).unwrap();
        read.header.crc = 0;
        assert_eq!(read, agf);
    }

    // Checks that nonzero spare bytes, in the structure or the rest of its block, are refused.
    #[test]
    fn nonzero_spare_bytes_are_refused() {
        let g = sample_geometry();
        let expected = Expected {
            kind: MetaKind::Agf,
            blkno: g.ag_start(2) + 1,
            uuid: UUID,
            owner: Some(2),
        };
        for at in [108, 127, 128, g.block_size as usize - 1] {
            let mut block = vec![0u8; g.block_size as usize];
            sample(2).encode(&mut block);
            block[at] = 1;
            stamp(&mut block, None);
            assert!(
                matches!(
                    Agf::read(&block, &expected, &g),
                    Err(FormatError::BadField { value, .. }) if value == at as u64
                ),
                "byte {at} accepted"
            );
        }
    }

    // Checks that each inconsistent field is refused and named.
    #[test]
    fn inconsistent_fields_are_named() {
        let g = sample_geometry();
        let field_of = |agf: Agf| match Agf::decode(&agf.to_bytes()).and_then(|a| a.check(&g)) {
            Err(FormatError::BadField { field, .. }) => field,
            other => panic!("accepted or wrong error: {other:?}"),
        };
        assert_eq!(
            field_of(Agf {
                bno_root: AgBlock(2),
                ..sample(0)
            }),
            "bno_root"
        );
        assert_eq!(
            field_of(Agf {
                cnt_levels: 0,
                ..sample(0)
            }),
            "cnt_levels"
        );
        assert_eq!(
            field_of(Agf {
                longest_free: u32::MAX,
                ..sample(0)
            }),
            "longest_free"
        );
        assert_eq!(
            field_of(Agf {
                ag_number: AgNumber(1),
                ..sample(0)
            }),
            "owner"
        );
        assert_eq!(
            field_of(Agf {
                free_list_count: 3,
                ..sample(0)
            }),
            "free_list_count"
        );
        assert_eq!(
            field_of(Agf {
                free_list_first: 9999,
                ..sample(0)
            }),
            "free_list_first"
        );
        assert_eq!(
            field_of(Agf {
                ag_length: 65_535,
                free_blocks: 10,
                longest_free: 10,
                ..sample(0)
            }),
            "ag_length"
        );
        assert_eq!(
            field_of(Agf {
                refcount_root: AgBlock(9),
                ..sample(0)
            }),
            "refcount_root"
        );
        assert_eq!(
            field_of(Agf {
                refcount_root: AgBlock(9),
                refcount_levels: 1,
                ..sample(0)
            }),
            "refcount_blocks"
        );
        assert_eq!(
            field_of(Agf {
                refcount_root: AgBlock(2),
                refcount_levels: 1,
                refcount_blocks: 1,
                ..sample(0)
            }),
            "refcount_root"
        );
    }

    // Checks the circular free list: empty, wrapping and full lists are all consistent.
    #[test]
    fn free_list_wraps() {
        let g = sample_geometry();
        let cap = agfl_capacity(g.block_size);
        let empty = Agf {
            free_list_first: 0,
            free_list_last: cap - 1,
            free_list_count: 0,
            ..sample(1)
        };
        assert!(empty.check(&g).is_ok());
        assert_eq!(empty.free_list_slots(cap).count(), 0);
        let wrap = Agf {
            free_list_first: cap - 2,
            free_list_last: 1,
            free_list_count: 4,
            ..sample(1)
        };
        assert!(wrap.check(&g).is_ok());
        let slots: Vec<u32> = wrap.free_list_slots(cap).collect();
        assert_eq!(slots, vec![cap - 2, cap - 1, 0, 1]);
        let full = Agf {
            free_list_first: 5,
            free_list_last: 4,
            free_list_count: cap,
            ..sample(1)
        };
        assert!(full.check(&g).is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn agf_round_trip(
            ag in 0u32..4, bno in 4u32..65_536, cnt in 4u32..65_536, levels in 1u32..=12,
            free in 0u32..65_000, btree_blocks in 0u32..65_536, first in 0u32..1000,
            count in 0u32..1000, lsn: u64, refcount in (4u32..65_536, 1u32..=12),
            has_refcount: bool,
        ) {
            let mut agf = sample(ag);
            agf.header.lsn = crate::types::Lsn(lsn);
            agf.bno_root = AgBlock(bno);
            agf.cnt_root = AgBlock(cnt);
            agf.bno_levels = levels;
            agf.cnt_levels = 13 - levels;
            agf.free_blocks = free;
            agf.longest_free = free / 2;
            agf.btree_blocks = btree_blocks;
            agf.free_list_first = first;
            agf.free_list_count = count;
            agf.free_list_last = (first + count + 1000 - 1) % 1000;
            if has_refcount {
                agf.refcount_root = AgBlock(refcount.0);
                agf.refcount_levels = refcount.1;
                agf.refcount_blocks = refcount.1 + 3;
            }
            prop_assert_eq!(Agf::decode(&agf.to_bytes()).unwrap(), agf);
        }

        #[test]
        fn agf_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(agf) = Agf::decode(&raw) {
                let _ = agf.check(&sample_geometry());
                let _ = agf.free_list_slots(agfl_capacity(4096)).count();
            }
        }
    }
}
