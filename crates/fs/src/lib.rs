//! cairn-fs: the filesystem core as a plain Rust library (no FUSE): mount and unmount with
//! recovery, inodes allocated in chunks through per-AG inode and free-inode trees, short-form
//! and block directories, symlinks, hard links, data I/O straight to the device with
//! unwritten extents, truncate, the unlinked list, fsync and statfs. Every change is made in
//! a journal transaction. The design and the crash arguments are in `docs/fs.md`.
//!
//! Owns: the in-core inode cache (one copy per inode, under its metadata lock), the per-AG
//! inode counts, file data mappings (`bmap`), data I/O (`data`), directories and the
//! unlinked lists.
//! Invariants:
//! - every metadata change is logged in a transaction; an inode is changed only under its
//!   metadata lock and logged whole before that lock is released;
//! - new data blocks are mapped unwritten until the data is on the device, so a crash never
//!   exposes stale blocks;
//! - an inode whose link count reached 0 is on its AG's unlinked list until freed;
//! - locks are taken parent directory before child, inode locks before log space and the
//!   transaction's buffer locks, every AGI before every AGF and each by ascending AG; every
//!   lock is ranked (`cairn_lockrank`), so debug builds check this order (docs/fs.md, "Lock
//!   order");
//! - a cached inode is dropped only when its home copy equals it.

mod acl;
mod attr;
mod background;
mod bmap;
mod bmap_tree;
mod commit;
mod cow;
mod data;
mod dir;
mod dir_index;
mod discard;
mod error;
mod extents;
mod fallocate;
mod flags;
mod fs;
mod give_back;
mod glue;
mod grow;
mod ialloc;
mod inode;
mod iobuf;
mod namei;
mod perm;
mod prealloc;
mod reads;
mod recovery;
mod reflink;
mod remove;
mod rename;
mod seek;
mod shift;
mod symlink;
#[cfg(test)]
mod test_device;
mod tmpfile;
mod types;
mod unlinked;
mod whiteout;
mod write_behind;
mod xattr;
mod xattr_index;
mod xattr_store;

pub use attr::handle_is_direct;
pub use background::BackgroundSignal;
pub use discard::TrimReport;
pub use error::FsError;
pub use fs::Filesystem;
pub use grow::{GrowReport, HeldInode, grown_geometry};
pub use iobuf::ReadData;
pub use prealloc::BackgroundScan;
pub use reads::{Deliver, PooledBuf, ReadStats};
pub use reflink::ReflinkStats;
pub use seek::FileExtent;
pub use types::{
    AtimeMode, Attr, COMMIT_INTERVAL_MS_DEFAULT, Credentials, DataStats, DirEntry, FallocateMode,
    FileAttributes, FileAttributesReport, FileKind, FsOpStats, FsStats, InodeFlags, LogMode,
    MountOptions, OpenFile, OpenMode, RenameMode, SeekKind, SetAttr, StatFs, TimeOrNow,
    WriteOrigin, XattrFlags,
};
pub use write_behind::WriteBehindStats;
