//! Log space reservations: what a transaction may add to the log, taken before it changes
//! anything, so it can never run out of log space half way.

use cairn_format::Geometry;

use crate::config::{
    BUFFER_ITEM_BYTES_MAX, INTENT_ITEM_BYTES_MAX, ITEM_HEADER_BYTES, RECORD_HEADER_BYTES,
    RECORD_PAYLOAD_BYTES_MAX, VECTOR_REGIONS_MAX,
};

/// Log bytes reserved by one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reservation {
    pub bytes: u64,
}

/// Worst-case encoded size of a buffer item for a buffer of `buffer_bytes`:
/// `16 (item header) + 8 (count, size) + 8 * VECTOR_REGIONS_MAX (region table) + buffer_bytes`.
/// More regions than `VECTOR_REGIONS_MAX` are logged as one region, so this is the bound.
pub fn buffer_item_bytes_max(buffer_bytes: u64) -> u64 {
    (ITEM_HEADER_BYTES + 8 + 8 * VECTOR_REGIONS_MAX as u64 + buffer_bytes).next_multiple_of(8)
}

/// Encoded size of an inode item: `16 + inode_size`, padded to 8.
pub fn inode_item_bytes(inode_size: u64) -> u64 {
    (ITEM_HEADER_BYTES + inode_size).next_multiple_of(8)
}

/// Worst-case bytes one checkpoint of `items_bytes` of items takes in the log:
/// `items + 16 (start item)`
/// `+ (ceil(items / (RECORD_PAYLOAD_MAX / 2)) + 2) * 2 * block` (each record's header sector,
/// rounded to a block, and its padding; records close early when the next item does not fit,
/// so each carries at least half the maximum; plus a first record and one split at the wrap)
/// `+ block` (the commit record)
/// `+ BUFFER_ITEM_BYTES_MAX + RECORD_HEADER + block` (the filler written before a wrap, which
/// is shorter than the item that did not fit plus a header).
pub fn checkpoint_bytes_max(items_bytes: u64, block_size: u64) -> u64 {
    let records = items_bytes.div_ceil(RECORD_PAYLOAD_BYTES_MAX / 2) + 2;
    items_bytes
        + ITEM_HEADER_BYTES
        + records * 2 * block_size
        + block_size
        + BUFFER_ITEM_BYTES_MAX
        + RECORD_HEADER_BYTES
        + block_size
}

impl Reservation {
    /// A reservation of exactly `bytes`.
    pub const fn new(bytes: u64) -> Self {
        Self { bytes }
    }

    /// The worst case of a transaction that changes at most `buffers` buffers of at most
    /// `buffer_bytes` each, logs `inodes` inodes of `inode_size` bytes and `intents` intent or
    /// done items:
    /// `buffers * buffer_item_bytes_max(buffer_bytes) + inodes * inode_item_bytes(inode_size)`
    /// `+ intents * INTENT_ITEM_BYTES_MAX + 2 * block_size`,
    /// where the last term is the transaction's share of record overhead: adding its items to
    /// a checkpoint can start at most one more record (a header block and a padding block).
    pub fn for_items(
        geometry: &Geometry,
        buffers: u32,
        buffer_bytes: u32,
        inodes: u32,
        intents: u32,
    ) -> Self {
        let block = u64::from(geometry.block_size);
        let bytes = u64::from(buffers) * buffer_item_bytes_max(u64::from(buffer_bytes))
            + u64::from(inodes) * inode_item_bytes(u64::from(geometry.inode_size))
            + u64::from(intents) * INTENT_ITEM_BYTES_MAX
            + 2 * block;
        Self { bytes }
    }

    /// Creating a file in a directory, XFS's create reservation in our terms:
    /// the AGI, the inode-tree path (`2 * BTREE_LEVELS_MAX` blocks: a split at every level),
    /// the free-inode-tree path (same), a new inode chunk (`chunk_blocks` blocks), the AGF, AGFL
    /// and both free-space-tree paths for the chunk allocation (`2 + 2 * BTREE_LEVELS_MAX`),
    /// the directory's data block, free-space block and hash-tree path (`2 + BTREE_LEVELS_MAX`);
    /// two inodes (the new one and the directory).
    pub fn create(geometry: &Geometry) -> Self {
        let levels = cairn_format::limits::BTREE_LEVELS_MAX;
        let buffers = 1 + 4 * levels + geometry.chunk_blocks() + 2 + 2 * levels + 2 + levels;
        Self::for_items(geometry, buffers, geometry.block_size, 2, 0)
    }

    /// Removing a file's directory entry and freeing its inode: the directory's data and hash
    /// paths (`2 + BTREE_LEVELS_MAX`), the AGI and the unlinked bucket, both inode-tree paths
    /// (`2 * BTREE_LEVELS_MAX`), the inode chunk block; two inodes and one free intent.
    pub fn remove(geometry: &Geometry) -> Self {
        let levels = cairn_format::limits::BTREE_LEVELS_MAX;
        let buffers = 2 + levels + 1 + 2 * levels + 1;
        Self::for_items(geometry, buffers, geometry.block_size, 2, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the formulas' ordering: more items never need less space, and overhead is bounded.
    #[test]
    fn reservations_grow_with_items() {
        let geometry = Geometry::new(4096, 512, 512, 262_144, 65_536, 16, 2048).unwrap();
        let small = Reservation::for_items(&geometry, 1, 4096, 0, 0);
        let large = Reservation::for_items(&geometry, 2, 4096, 1, 1);
        assert!(small < large);
        assert!(small.bytes >= buffer_item_bytes_max(4096));
        assert!(Reservation::create(&geometry).bytes < 1 << 20);
        assert!(checkpoint_bytes_max(0, 4096) < checkpoint_bytes_max(1 << 20, 4096));
        assert_eq!(inode_item_bytes(512), 528);
    }
}
