//! Every named limit of the v1 format.

/// Smallest and largest filesystem block size.
pub const BLOCK_SIZE_MIN: u32 = 512;
pub const BLOCK_SIZE_MAX: u32 = 65536;
pub const BLOCK_SIZE_DEFAULT: u32 = 4096;

/// Sector sizes the format accepts (the device's logical sector size).
pub const SECTOR_SIZE_MIN: u32 = 512;
pub const SECTOR_SIZE_MAX: u32 = 4096;

/// Inode sizes: power of two, at most one block.
pub const INODE_SIZE_MIN: u32 = 256;
pub const INODE_SIZE_MAX: u32 = 2048;
pub const INODE_SIZE_DEFAULT: u32 = 512;

/// Inodes are allocated in chunks of this many, tracked by one inode-tree record.
pub const INODES_PER_CHUNK: u32 = 64;

/// Allocation group size bounds, in blocks. The lower bound keeps room for the headers, the
/// initial tree roots and a useful amount of free space; the upper bound keeps AG block
/// numbers in 31 bits so a `u32` never overflows in `agbno + len`.
pub const AG_BLOCKS_MIN: u32 = 64;
pub const AG_BLOCKS_MAX: u32 = 1 << 31;
/// Maximum number of allocation groups.
pub const AG_COUNT_MAX: u32 = 1 << 20;

/// Static blocks at the start of every AG: superblock copy, free-space header (AGF), inode
/// header (AGI), AG free list (AGFL).
pub const AG_SUPERBLOCK: u32 = 0;
pub const AG_AGF_BLOCK: u32 = 1;
pub const AG_AGI_BLOCK: u32 = 2;
pub const AG_AGFL_BLOCK: u32 = 3;
/// Roots of the per-AG trees created by mkfs: free space by block, free space by length, inode
/// chunks, chunks with free inodes.
pub const AG_BNO_ROOT: u32 = 4;
pub const AG_CNT_ROOT: u32 = 5;
pub const AG_INO_ROOT: u32 = 6;
pub const AG_FINO_ROOT: u32 = 7;
/// First block of an AG that mkfs leaves to the allocator.
pub const AG_FIRST_FREE: u32 = 8;

/// Log size bounds in blocks, and the default fraction of the filesystem used by the log.
pub const LOG_BLOCKS_MIN: u32 = 64;
pub const LOG_BYTES_MAX: u64 = 2 << 30;
pub const LOG_BYTES_MIN: u64 = 512 * 1024;
/// Smallest log mkfs makes. The journal refuses a transaction reserving more than a quarter of
/// the log, and cairn's largest transactions (a create splitting every tree level, a data
/// mapping step) change up to about 170 blocks, so a log of four times that with room for the
/// checkpoint headers is 1024 blocks: 4 MiB with 4 KiB blocks.
pub const LOG_BLOCKS_USABLE_MIN: u32 = 1024;

/// Longest file name in bytes.
pub const NAME_LEN_MAX: usize = 255;
/// Longest label in bytes.
pub const LABEL_LEN_MAX: usize = 32;
/// Longest symlink target in bytes.
pub const SYMLINK_LEN_MAX: usize = 4096;
/// Longest extended attribute name and value in bytes.
pub const XATTR_NAME_LEN_MAX: usize = 255;
pub const XATTR_VALUE_LEN_MAX: usize = 65536;
/// Most entries of a POSIX ACL: as many as an attribute value holds (4 + 8 bytes each).
pub const ACL_ENTRIES_MAX: usize = (XATTR_VALUE_LEN_MAX - 4) / 8;

/// Number of buckets of the per-AG unlinked-inode hash in the AGI.
pub const AGI_UNLINKED_BUCKETS: usize = 64;

/// Largest length of one extent record, in blocks (21 bits).
pub const EXTENT_LEN_MAX: u32 = (1 << 21) - 1;
/// Largest logical file block (54 bits) and physical block (52 bits) an extent can address.
pub const FILE_BLOCK_MAX: u64 = (1 << 54) - 1;
pub const FS_BLOCK_MAX: u64 = (1 << 52) - 1;

/// Blocks at the start of every AG that are never allocated: superblock copy, AGF, AGI, AGFL.
/// Every dynamically allocated AG block number is at least this.
pub const AG_HEADER_BLOCKS: u32 = 4;

/// Tallest B+tree of any kind, counted in levels (a tree whose root is a leaf has one level).
/// With the smallest block (512 bytes) the narrowest node still holds 18 pointers when half
/// full, and 18^11 exceeds every record count the format can describe, so 12 is never reached
/// by a well-formed tree; anything taller is corruption.
pub const BTREE_LEVELS_MAX: u32 = 12;

/// Most directory entries an inline (short-form) directory may hold; the count field is a
/// `u16` but the data fork of the largest inode holds far fewer.
pub const DIR_INLINE_ENTRIES_MAX: usize = 2048;
/// Directory data blocks live in the first `1 << DIR_DATA_BLOCK_BITS` logical blocks of a
/// directory; a data address packs the block index above the entry offset (see `dir.rs`).
pub const DIR_DATA_BLOCK_BITS: u32 = 19;

/// Log items in one checkpoint are limited by the log size; one item's dirty regions are
/// limited by the block size (at most one region per 8 bytes of the largest block).
pub const LOG_ITEM_REGIONS_MAX: usize = (BLOCK_SIZE_MAX as usize) / 8;
/// Extents one extent-free intent may carry.
pub const LOG_INTENT_EXTENTS_MAX: usize = 64;
