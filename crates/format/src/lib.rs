//! cairn's on-disk format, version 1: every structure's layout, its codec, and the checks that
//! make metadata self-describing. The byte-level specification is `docs/format.md`.
//!
//! Owns: the encoding of every on-disk structure, CRC32C stamping and verification, geometry
//! validation and address arithmetic.
//! Invariants:
//! - all integers are little-endian at fixed byte offsets; nothing is transmuted;
//! - decoding validates untrusted fields before any arithmetic uses them and never panics;
//! - every metadata block starts with `MetaHeader` (magic, CRC32C, own block, UUID, owner,
//!   LSN); `verify_header` checks them in that order, `stamp` sets LSN and CRC last.

pub mod acl;
pub mod agf;
pub mod agfl;
pub mod agi;
pub mod btree_block;
pub mod dir;
mod error;
pub mod extent;
pub mod geometry;
pub mod header;
pub mod inode;
pub mod limits;
pub mod log;
pub mod ondisk;
pub mod refcount;
pub mod superblock;
pub mod symlink;
pub mod types;
pub mod xattr;

mod sizes;
#[cfg(test)]
mod testing;

pub use agf::Agf;
pub use agfl::{Agfl, agfl_capacity, agfl_entry, set_agfl_entry};
pub use agi::Agi;
pub use btree_block::{
    BTREE_HEADER_SIZE, BnoKey, BtreeHeader, BtreeLayout, CntKey, FreeSpaceRecord, InoKey,
    InodeRecord,
};
pub use dir::{
    DirDataEntry, DirDataHeader, DirHashKey, DirHashRecord, ShortformDir, ShortformEntry,
};
pub use error::FormatError;
pub use extent::{BmapKey, BmapPointer, Extent};
pub use geometry::Geometry;
pub use header::{
    Expected, HEADER_SIZE, MetaHeader, MetaKind, block_crc, block_lsn, stamp, verify_header,
};
pub use inode::{BmapRoot, FileType, ForkFormat, INODE_CORE_SIZE, InodeCore, Timestamp};
pub use log::{LogItem, LogRecordHeader};
pub use ondisk::OnDisk;
pub use refcount::{RefcountKey, RefcountRecord};
pub use superblock::Superblock;
pub use symlink::SymlinkHeader;
pub use types::{AgBlock, AgNumber, FsBlock, InodeNumber, Lsn};
pub use xattr::{
    Namespace, Xattr, XattrIndexKey, XattrIndexRecord, XattrIndexRoot, XattrLeaf, XattrLeafEntry,
    XattrLeafHeader, XattrValue,
};
