//! The self-describing header at the front of every metadata block (and every inode), and the
//! read/write verification every metadata block goes through.
//!
//! Layout (48 bytes, little-endian):
//!
//! | offset | size | field  | meaning                                              |
//! |--------|------|--------|------------------------------------------------------|
//! | 0      | 4    | magic  | structure kind and format version                    |
//! | 4      | 4    | crc    | CRC32C of the whole block with this field as zero    |
//! | 8      | 8    | blkno  | the block's own filesystem block (inode: its number) |
//! | 16     | 8    | lsn    | LSN of the last checkpoint that changed the block    |
//! | 24     | 16   | uuid   | filesystem UUID                                      |
//! | 40     | 8    | owner  | AG number for AG metadata, inode number for files    |

use crate::FormatError;
use crate::ondisk::{OnDisk, get_bytes, get_u32, get_u64, need, put_bytes, put_u32, put_u64};
use crate::types::Lsn;

pub const HEADER_SIZE: usize = 48;
const CRC_OFFSET: usize = 4;
const LSN_OFFSET: usize = 16;

/// Every kind of self-describing metadata. The magic differs per kind and per format version,
/// so a block of one kind can never be taken for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetaKind {
    Superblock,
    Agf,
    Agi,
    Agfl,
    BnoBtree,
    CntBtree,
    InoBtree,
    FinoBtree,
    BmapBtree,
    Inode,
    DirData,
    DirBtree,
    AttrBlock,
    AttrBtree,
    SymlinkBlock,
    RefcountBtree,
}

impl MetaKind {
    pub const ALL: [MetaKind; 16] = [
        Self::Superblock,
        Self::Agf,
        Self::Agi,
        Self::Agfl,
        Self::BnoBtree,
        Self::CntBtree,
        Self::InoBtree,
        Self::FinoBtree,
        Self::BmapBtree,
        Self::Inode,
        Self::DirData,
        Self::DirBtree,
        Self::AttrBlock,
        Self::AttrBtree,
        Self::SymlinkBlock,
        Self::RefcountBtree,
    ];

    /// The magic number: four ASCII bytes read as a little-endian `u32`; the last byte is the
    /// format version ('1').
    pub const fn magic(self) -> u32 {
        let tag: &[u8; 4] = match self {
            Self::Superblock => b"CSB1",
            Self::Agf => b"CAF1",
            Self::Agi => b"CAI1",
            Self::Agfl => b"CFL1",
            Self::BnoBtree => b"CBB1",
            Self::CntBtree => b"CBC1",
            Self::InoBtree => b"CIB1",
            Self::FinoBtree => b"CFB1",
            Self::BmapBtree => b"CMB1",
            Self::Inode => b"CIN1",
            Self::DirData => b"CDD1",
            Self::DirBtree => b"CDB1",
            Self::AttrBlock => b"CXA1",
            Self::AttrBtree => b"CXB1",
            Self::SymlinkBlock => b"CSL1",
            Self::RefcountBtree => b"CRF1",
        };
        u32::from_le_bytes(*tag)
    }

    /// Human-readable structure name for error messages and fsck reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Superblock => "superblock",
            Self::Agf => "AG free-space header",
            Self::Agi => "AG inode header",
            Self::Agfl => "AG free list",
            Self::BnoBtree => "free-space-by-block tree block",
            Self::CntBtree => "free-space-by-length tree block",
            Self::InoBtree => "inode tree block",
            Self::FinoBtree => "free-inode tree block",
            Self::BmapBtree => "file extent tree block",
            Self::Inode => "inode",
            Self::DirData => "directory data block",
            Self::DirBtree => "directory hash tree block",
            Self::AttrBlock => "xattr block",
            Self::AttrBtree => "xattr tree block",
            Self::SymlinkBlock => "symlink block",
            Self::RefcountBtree => "refcount tree block",
        }
    }

    pub fn from_magic(magic: u32) -> Option<MetaKind> {
        Self::ALL.into_iter().find(|k| k.magic() == magic)
    }
}

/// The decoded common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaHeader {
    pub magic: u32,
    pub crc: u32,
    pub blkno: u64,
    pub lsn: Lsn,
    pub uuid: [u8; 16],
    pub owner: u64,
}

impl MetaHeader {
    pub fn new(kind: MetaKind, blkno: u64, uuid: [u8; 16], owner: u64) -> Self {
        Self {
            magic: kind.magic(),
            crc: 0,
            blkno,
            lsn: Lsn::ZERO,
            uuid,
            owner,
        }
    }
}

impl OnDisk for MetaHeader {
    const SIZE: usize = HEADER_SIZE;
    const NAME: &'static str = "metadata header";

    fn encode(&self, out: &mut [u8]) {
        put_u32(out, 0, self.magic);
        put_u32(out, CRC_OFFSET, self.crc);
        put_u64(out, 8, self.blkno);
        put_u64(out, LSN_OFFSET, self.lsn.0);
        put_bytes(out, 24, &self.uuid);
        put_u64(out, 40, self.owner);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        Ok(Self {
            magic: get_u32(raw, 0),
            crc: get_u32(raw, CRC_OFFSET),
            blkno: get_u64(raw, 8),
            lsn: Lsn(get_u64(raw, LSN_OFFSET)),
            uuid: get_bytes::<16>(raw, 24),
            owner: get_u64(raw, 40),
        })
    }
}

/// What the reader of a block expects to find; anything else is corruption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub kind: MetaKind,
    /// The address the block was read from (for inodes: the inode number).
    pub blkno: u64,
    pub uuid: [u8; 16],
    /// The owner, when the reader knows it (AG number or inode number).
    pub owner: Option<u64>,
}

/// CRC32C of `block` with its CRC field taken as zero.
pub fn block_crc(block: &[u8]) -> u32 {
    let head = crc32c::crc32c(&block[..CRC_OFFSET]);
    let zeroed = crc32c::crc32c_append(head, &[0u8; 4]);
    crc32c::crc32c_append(zeroed, &block[CRC_OFFSET + 4..])
}

/// Read verification, in the order that gives the most precise report: length, magic, CRC,
/// own address, filesystem UUID, owner. Structure-specific checks follow in each codec.
pub fn verify_header(block: &[u8], expected: &Expected) -> Result<MetaHeader, FormatError> {
    let structure = expected.kind.name();
    need(structure, block, HEADER_SIZE)?;
    let header = MetaHeader::decode(block)?;
    let at = expected.blkno;
    if header.magic != expected.kind.magic() {
        return Err(FormatError::BadMagic {
            structure,
            block: at,
            expected: expected.kind.magic(),
            found: header.magic,
        });
    }
    let computed = block_crc(block);
    if header.crc != computed {
        return Err(FormatError::BadCrc {
            structure,
            block: at,
            found: header.crc,
            computed,
        });
    }
    if header.blkno != at {
        return Err(FormatError::WrongBlock {
            structure,
            block: at,
            found: header.blkno,
        });
    }
    if header.uuid != expected.uuid {
        return Err(FormatError::WrongUuid {
            structure,
            block: at,
        });
    }
    if let Some(owner) = expected.owner
        && header.owner != owner
    {
        return Err(FormatError::WrongOwner {
            structure,
            block: at,
            expected: owner,
            found: header.owner,
        });
    }
    Ok(header)
}

/// Write preparation: records `lsn` (when given) and recomputes the CRC. Called on the way
/// out, after the structure-specific write check, so the CRC covers exactly what is written.
pub fn stamp(block: &mut [u8], lsn: Option<Lsn>) {
    debug_assert!(block.len() >= HEADER_SIZE);
    if let Some(lsn) = lsn {
        put_u64(block, LSN_OFFSET, lsn.0);
    }
    let crc = block_crc(block);
    put_u32(block, CRC_OFFSET, crc);
}

/// The LSN recorded in a block's header (recovery compares it with a checkpoint's LSN).
pub fn block_lsn(block: &[u8]) -> Option<Lsn> {
    (block.len() >= HEADER_SIZE).then(|| Lsn(get_u64(block, LSN_OFFSET)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(kind: MetaKind, len: usize) -> (Vec<u8>, Expected) {
        let uuid = [9u8; 16];
        let mut block = vec![0u8; len];
        MetaHeader::new(kind, 77, uuid, 3).encode(&mut block);
        block[HEADER_SIZE..]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        stamp(&mut block, Some(Lsn::new(2, 40)));
        (
            block,
            Expected {
                kind,
                blkno: 77,
                uuid,
                owner: Some(3),
            },
        )
    }

    // Checks that a stamped block verifies and carries the stamped LSN.
    #[test]
    fn stamped_block_verifies() {
        for kind in MetaKind::ALL {
            let (block, expected) = sample(kind, 512);
            let header = verify_header(&block, &expected).unwrap();
            assert_eq!(header.lsn, Lsn::new(2, 40));
            assert_eq!(block_lsn(&block), Some(Lsn::new(2, 40)));
        }
    }

    // Checks that each expectation mismatch gives its own typed error.
    #[test]
    fn each_mismatch_is_named() {
        let (block, expected) = sample(MetaKind::Agf, 512);
        let wrong_kind = Expected {
            kind: MetaKind::Agi,
            ..expected
        };
        assert!(matches!(
            verify_header(&block, &wrong_kind),
            Err(FormatError::BadMagic { .. })
        ));
        let wrong_block = Expected {
            blkno: 78,
            ..expected
        };
        assert!(matches!(
            verify_header(&block, &wrong_block),
            Err(FormatError::WrongBlock { .. })
        ));
        let wrong_uuid = Expected {
            uuid: [1; 16],
            ..expected
        };
        assert!(matches!(
            verify_header(&block, &wrong_uuid),
            Err(FormatError::WrongUuid { .. })
        ));
        let wrong_owner = Expected {
            owner: Some(4),
            ..expected
        };
        assert!(matches!(
            verify_header(&block, &wrong_owner),
            Err(FormatError::WrongOwner { .. })
        ));
        assert!(matches!(
            verify_header(&block[..20], &expected),
            Err(FormatError::TooShort { .. })
        ));
    }

    // Checks that the magics are distinct, so no kind can pass for another.
    #[test]
    fn magics_are_distinct() {
        for (i, a) in MetaKind::ALL.iter().enumerate() {
            assert_eq!(MetaKind::from_magic(a.magic()), Some(*a));
            for b in &MetaKind::ALL[i + 1..] {
                assert_ne!(a.magic(), b.magic());
            }
        }
    }

    proptest! {
        // Any single flipped bit is caught (CRC32C detects all 1-bit errors).
        #[test]
        fn any_bit_flip_is_detected(byte in 0usize..512, bit in 0u8..8) {
            let (mut block, expected) = sample(MetaKind::BnoBtree, 512);
            block[byte] ^= 1 << bit;
            prop_assert!(verify_header(&block, &expected).is_err());
        }

        #[test]
        fn header_round_trip(
            magic: u32,
            crc: u32,
            blkno: u64,
            lsn: u64,
            uuid: [u8; 16],
            owner: u64,
        ) {
            let header = MetaHeader { magic, crc, blkno, lsn: Lsn(lsn), uuid, owner };
            prop_assert_eq!(MetaHeader::decode(&header.to_bytes()).unwrap(), header);
        }

        #[test]
        fn random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            let expected = Expected { kind: MetaKind::Agi, blkno: 2, uuid: [0; 16], owner: None };
            let _ = verify_header(&raw, &expected);
        }
    }
}
