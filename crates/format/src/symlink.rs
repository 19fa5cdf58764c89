//! The remote symlink block: holds the part of a symlink target that does not fit inline in
//! the inode (magic "CSL1", owner = the symlink's inode).
//!
//! Layout (little-endian):
//!
//! | offset | size   | field  | meaning                                               |
//! |--------|--------|--------|-------------------------------------------------------|
//! | 0      | 48     | header | `MetaHeader`                                          |
//! | 48     | 4      | offset | byte offset of this piece within the whole target     |
//! | 52     | 4      | length | bytes of target in this block                         |
//! | 56     | length | target | the bytes; the rest of the block is zero              |
//!
//! A target of `size` bytes (the inode's size) spans `ceil(size / (block_size - 56))` blocks
//! of the data fork, pieces in order.

use crate::FormatError;
use crate::header::MetaHeader;
use crate::limits::SYMLINK_LEN_MAX;
use crate::ondisk::{OnDisk, bad_field, check_zero, get_u32, need, put_u32};

/// Bytes before the target in a symlink block.
pub const SYMLINK_HEADER_SIZE: usize = 56;

/// Target bytes one block of `block_size` bytes holds.
pub const fn symlink_block_capacity(block_size: u32) -> usize {
    (block_size as usize).saturating_sub(SYMLINK_HEADER_SIZE)
}

/// The decoded fixed part of a symlink block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymlinkHeader {
    pub header: MetaHeader,
    pub offset: u32,
    pub length: u32,
}

impl OnDisk for SymlinkHeader {
    const SIZE: usize = SYMLINK_HEADER_SIZE;
    const NAME: &'static str = "symlink block";

    fn encode(&self, out: &mut [u8]) {
        self.header.encode(out);
        put_u32(out, 48, self.offset);
        put_u32(out, 52, self.length);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let header = MetaHeader::decode(raw)?;
        let (offset, length) = (get_u32(raw, 48), get_u32(raw, 52));
        if length == 0 || u64::from(offset) + u64::from(length) > SYMLINK_LEN_MAX as u64 {
            let why = "empty piece or target past SYMLINK_LEN_MAX";
            return Err(bad_field(
                Self::NAME,
                header.blkno,
                "length",
                length.into(),
                why,
            ));
        }
        Ok(Self {
            header,
            offset,
            length,
        })
    }
}

/// Writes a whole symlink block holding `piece`, found at `offset` in the target.
pub fn encode_symlink_block(
    block: &mut [u8],
    header: MetaHeader,
    offset: u32,
    piece: &[u8],
) -> Result<(), FormatError> {
    need(
        SymlinkHeader::NAME,
        block,
        SYMLINK_HEADER_SIZE + piece.len(),
    )?;
    let length = piece.len() as u32;
    let symlink = SymlinkHeader {
        header,
        offset,
        length,
    };
    // Validate with the decoder's rules before anything is written.
    SymlinkHeader::decode(&symlink.to_bytes())?;
    symlink.encode(block);
    block[SYMLINK_HEADER_SIZE..SYMLINK_HEADER_SIZE + piece.len()].copy_from_slice(piece);
    block[SYMLINK_HEADER_SIZE + piece.len()..].fill(0);
    Ok(())
}

/// Decodes a symlink block: its header and its piece of the target.
pub fn decode_symlink_block(block: &[u8]) -> Result<(SymlinkHeader, &[u8]), FormatError> {
    let header = SymlinkHeader::decode(block)?;
    let end = SYMLINK_HEADER_SIZE + header.length as usize;
    need(SymlinkHeader::NAME, block, end)?;
    check_zero(
        SymlinkHeader::NAME,
        header.header.blkno,
        "tail",
        block,
        end..block.len(),
    )?;
    Ok((header, &block[SYMLINK_HEADER_SIZE..end]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::MetaKind;
    use crate::testing::UUID;
    use proptest::prelude::*;

    // Checks that a piece that does not fit, or is empty, is refused.
    #[test]
    fn pieces_must_fit() {
        let header = MetaHeader::new(MetaKind::SymlinkBlock, 5, UUID, 4160);
        let mut block = vec![0u8; 512];
        assert!(encode_symlink_block(&mut block, header, 0, &[b'a'; 457]).is_err());
        assert!(encode_symlink_block(&mut block, header, 0, &[]).is_err());
        assert!(encode_symlink_block(&mut block, header, 4000, &[b'a'; 100]).is_err());
        encode_symlink_block(&mut block, header, 0, &[b'a'; 456]).unwrap();
        assert_eq!(symlink_block_capacity(512), 456);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn symlink_round_trip(
            piece in proptest::collection::vec(1u8.., 1..456), offset in 0u32..3000, lsn: u64,
        ) {
            let mut header = MetaHeader::new(MetaKind::SymlinkBlock, 5, UUID, 4160);
            header.lsn = crate::types::Lsn(lsn);
            let mut block = vec![0u8; 512];
            encode_symlink_block(&mut block, header, offset, &piece).unwrap();
            let (read, target) = decode_symlink_block(&block).unwrap();
            prop_assert_eq!(read, SymlinkHeader { header, offset, length: piece.len() as u32 });
            prop_assert_eq!(target, &piece[..]);
            prop_assert_eq!(SymlinkHeader::decode(&read.to_bytes()).unwrap(), read);
        }

        #[test]
        fn symlink_random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_symlink_block(&raw);
        }
    }
}
