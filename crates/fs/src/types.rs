//! The value types of the public API: options, credentials, attributes, directory entries,
//! modes of rename, fallocate and seek, and the statistics snapshot.

use std::time::SystemTime;

pub use cairn_journal::LogMode;

/// How access times are updated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeMode {
    /// Update atime only when it is older than mtime or ctime, or a day old.
    #[default]
    Relatime,
    /// Never update atime.
    Noatime,
    /// Update atime on every read.
    Strict,
}

/// Mount options.
#[derive(Debug, Clone)]
pub struct MountOptions {
    pub read_only: bool,
    pub log_mode: LogMode,
    /// Metadata buffer cache memory limit; `None` = the cache's default.
    pub cache_bytes: Option<u64>,
    /// Fixed preallocation size (bytes); `None` = dynamic.
    pub alloc_size: Option<u64>,
    pub atime: AtimeMode,
    /// Allow log recovery on a read-only mount.
    pub recover_read_only: bool,
    /// Open the device through the page cache instead of `O_DIRECT` (`mount_path` only).
    pub buffered: bool,
    /// Online discard: give freed extents back to the device once their free is durable.
    pub discard: bool,
    /// Write-behind: bytes of written data held in memory before writeback (delayed
    /// allocation, see `write_behind`); 0 writes every write through to the device.
    pub data_cache: u64,
    /// The commit window (`-o commit=`): whatever the filesystem received longer ago than
    /// this is durable without an `fsync` (cached data written back, the log forced), as
    /// long as the daemon's background thread runs `background_pass` at least every
    /// quarter of it (`Filesystem::background_interval`).
    pub commit_interval_ms: u64,
    /// Bytes of memory for reads handed over and read-ahead (`Filesystem::read_handed_over`);
    /// with less, reads are synchronous and nothing is read ahead.
    pub read_buffers: u64,
}

/// The default commit window, ext4's `commit=` default.
pub const COMMIT_INTERVAL_MS_DEFAULT: u64 = 5_000;

/// Default `MountOptions::read_buffers`: 64 MiB (16 requests of 1 MiB in flight, and four
/// 4 MiB read-ahead windows beside them, with room to spare).
pub const READ_BUFFERS_DEFAULT_BYTES: u64 = 64 << 20;

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            read_only: false,
            log_mode: LogMode::Delayed,
            cache_bytes: None,
            alloc_size: None,
            atime: AtimeMode::default(),
            recover_read_only: false,
            buffered: false,
            discard: false,
            data_cache: 0,
            commit_interval_ms: COMMIT_INTERVAL_MS_DEFAULT,
            read_buffers: READ_BUFFERS_DEFAULT_BYTES,
        }
    }
}

/// Who performs an operation. uid 0 is root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The caller's file mode creation mask: `create` and `mkdir` apply it to
    /// the requested mode unless the parent directory has a default ACL, which then decides
    /// instead (POSIX). 0 leaves modes as given.
    pub umask: u16,
}

impl Credentials {
    /// Root credentials.
    pub fn root() -> Self {
        Self::default()
    }

    /// Whether the caller is in group `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The type of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

/// Attributes of an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub inode: u64,
    pub generation: u32,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky.
    pub mode: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub blocks_512: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub btime: SystemTime,
    pub block_size: u32,
    /// The flags a user sets with chattr (statx reports some of them).
    pub flags: InodeFlags,
}

/// The flags of an inode a user sets (`chattr`, `FS_IOC_SETFLAGS`, `FS_IOC_FSSETXATTR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InodeFlags {
    /// `i`: no change of data through new descriptors, of attributes, xattrs or names.
    pub immutable: bool,
    /// `a`: data may only be appended; no other change of attributes, xattrs or names.
    pub append_only: bool,
    /// `S`: writes are durable when they return.
    pub sync: bool,
    /// `A`: reads leave the access time alone.
    pub no_atime: bool,
    /// `d`: backup programs skip the file (stored only).
    pub no_dump: bool,
    /// `P`, directories only: new inodes take the directory's project id, new directories
    /// this flag.
    pub project_inherit: bool,
}

/// The attributes `chattr` and `FS_IOC_FSSETXATTR` set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileAttributes {
    pub flags: InodeFlags,
    /// Extent size hint in bytes, a multiple of the block size; 0 = none. A regular file
    /// allocates in whole aligned units of it; a directory passes it on to new inodes.
    pub extent_size_hint: u64,
    /// Project id (stored for project quotas, which cairn does not enforce).
    pub project_id: u32,
    /// Copy-on-write extent size hint in bytes, a multiple of the block size; 0 = none
    /// (reflink feature only). A write into shared blocks of a regular file copies whole
    /// aligned units of it; a directory passes it on to new inodes.
    pub cow_extent_size_hint: u64,
}

/// What `Filesystem::file_attributes` reports: the settable attributes and two facts about
/// the inode (XFS's `fsx_nextents` and `FS_XFLAG_HASATTR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileAttributesReport {
    pub attributes: FileAttributes,
    /// Extents in the data fork.
    pub extent_count: u32,
    /// Whether the inode has an attribute fork.
    pub has_xattrs: bool,
}

/// Where a write comes from (`Filesystem::write_from`), which the inode flags' rules
/// depend on.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOrigin<'a> {
    /// The open handle it came through, if known: a direct handle's write reaches the
    /// device before it returns, and a handle opened before the file became append-only
    /// may write anywhere (as on XFS).
    pub handle: Option<u64>,
    /// The kernel's writeback of its page cache (FUSE's `FUSE_WRITE_CACHE`): data written
    /// through descriptors opened before the file's flags were set (writers opened since
    /// bypass the cache), whichever handle the request names.
    pub from_cache: bool,
    /// A writer without CAP_FSETID: the set-ID bits go (`write_clearing_set_id`).
    pub clears_set_id: Option<&'a Credentials>,
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenMode {
    /// Opened for writing.
    pub write: bool,
    /// Every write appends (`O_APPEND`), which an append-only file requires of writers.
    pub append: bool,
    /// Empty the file (`O_TRUNC`).
    pub truncate: bool,
    /// `O_DIRECT`: writes reach the device before they return.
    pub direct: bool,
}

/// A time to set: a given instant or the current time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeOrNow {
    Time(SystemTime),
    Now,
}

/// Attribute changes; `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
    /// The open handle the change came through (`ftruncate`, `futimens`), if any.
    pub file: Option<u64>,
}

/// One directory entry returned by `readdir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub inode: u64,
    pub kind: FileKind,
    /// Pass back to continue after this entry.
    pub cookie: u64,
}

/// How `rename` treats an existing target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace an existing target (POSIX rename).
    Replace,
    /// Fail with `Exists` if the target exists.
    NoReplace,
    /// Swap source and target atomically; both must exist.
    Exchange,
}

/// What `fallocate` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallocateMode {
    Allocate {
        keep_size: bool,
    },
    PunchHole,
    ZeroRange {
        keep_size: bool,
    },
    /// Removes the (block-aligned) range; what follows moves down, the size shrinks by it.
    CollapseRange,
    /// Inserts a hole of the (block-aligned) range's length at its offset; what follows
    /// moves up, the size grows by it.
    InsertRange,
}

/// What `seek` looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekKind {
    Data,
    Hole,
}

/// Filesystem statistics for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub name_max: u32,
}

/// An open file: its inode and the handle `release` takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFile {
    pub inode: u64,
    pub handle: u64,
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrFlags {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `Exists` if the attribute exists.
    Create,
    /// Fail with `NoData` if it does not.
    Replace,
}

/// Counters of the filesystem's own operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsOpStats {
    pub lookups: u64,
    pub creates: u64,
    pub removes: u64,
    pub renames: u64,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub fsyncs: u64,
    pub inodes_cached: u64,
    pub inodes_reclaimed: u64,
    /// Inode reclaim passes run (each forces the log and pushes the AIL).
    pub inode_reclaim_passes: u64,
}

/// Counters of the data path: speculative preallocation and its trimming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataStats {
    /// Blocks mapped by writes that reached past their end (speculative preallocation).
    pub preallocated_blocks: u64,
    /// Unused speculative blocks given back (last close or idle scan).
    pub trimmed_blocks: u64,
    pub idle_scans: u64,
}

/// A snapshot of every subsystem's counters.
#[derive(Debug, Clone)]
pub struct FsStats {
    /// Why the filesystem shut down (the first error that stopped it), or `None`.
    pub shutdown: Option<String>,
    pub fs: FsOpStats,
    pub bufcache: cairn_bufcache::StatsSnapshot,
    pub journal: cairn_journal::JournalStats,
    pub alloc: cairn_alloc::AllocStats,
    pub data: DataStats,
    pub extcache: cairn_extcache::StatsSnapshot,
    pub write_behind: crate::write_behind::WriteBehindStats,
    pub reflink: crate::reflink::ReflinkStats,
    pub reads: crate::reads::ReadStats,
}
