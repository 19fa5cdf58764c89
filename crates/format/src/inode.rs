//! The on-disk inode. Inodes live in inode chunk blocks, `block_size / inode_size` to a block;
//! each carries its own `MetaHeader` (magic "CIN1", blkno = owner = the inode number) and its
//! CRC covers exactly its `inode_size` bytes.
//!
//! Core layout (176 bytes, little-endian):
//!
//! | offset | size | field              | meaning                                         |
//! |--------|------|--------------------|-------------------------------------------------|
//! | 0      | 48   | header             | `MetaHeader`                                    |
//! | 48     | 2    | mode               | file type bits and permissions; 0 = free inode  |
//! | 50     | 1    | data_format        | `ForkFormat` of the data fork                   |
//! | 51     | 1    | attr_format        | `ForkFormat` of the attr fork, 0 = no attr fork |
//! | 52     | 4    | uid                |                                                 |
//! | 56     | 4    | gid                |                                                 |
//! | 60     | 4    | nlink              |                                                 |
//! | 64     | 4    | generation         | bumped on each reuse of the inode number        |
//! | 68     | 4    | flags              | `INODE_FLAG_*`                                  |
//! | 72     | 8    | size               | bytes (Local data fork: its length)             |
//! | 80     | 8    | block_count        | blocks used, including tree blocks              |
//! | 88     | 8    | atime seconds      | i64 seconds since the epoch                     |
//! | 96     | 8    | mtime seconds      |                                                 |
//! | 104    | 8    | ctime seconds      |                                                 |
//! | 112    | 8    | btime seconds      | creation time                                   |
//! | 120    | 4    | atime nanoseconds  | < 1e9                                           |
//! | 124    | 4    | mtime nanoseconds  |                                                 |
//! | 128    | 4    | ctime nanoseconds  |                                                 |
//! | 132    | 4    | btime nanoseconds  |                                                 |
//! | 136    | 4    | extent_size_hint   | blocks, 0 = none                                |
//! | 140    | 4    | next_unlinked      | AG inode of the next unlinked inode, or NULL    |
//! | 144    | 4    | data_extent_count  | extents in the data fork                        |
//! | 148    | 2    | attr_extent_count  | extents in the attr fork                        |
//! | 150    | 2    | attr_offset        | attr fork start in 8-byte units, 0 = none       |
//! | 152    | 4    | rdev               | device number (Device format)                   |
//! | 156    | 4    | project_id         | stored for project quotas (not enforced)        |
//! | 160    | 4    | cow_extent_size_hint | blocks, 0 = none (reflink: CoW allocations)   |
//! | 164    | 12   | spare              | zero; reserved for growth                       |
//!
//! The literal area runs from byte 176 to `inode_size`: the data fork first, then the attr fork
//! from `176 + 8 * attr_offset`. Fork contents by format:
//!
//! - Local (1): raw bytes (symlink target of `size` bytes; short-form directory of `size`
//!   bytes; short-form attributes).
//! - Extents (2): packed 16-byte extents, `data_extent_count` / `attr_extent_count` of them.
//! - Btree (3): root node of the file extent tree: level u16 @0 (>= 1), count u16 @2, 4 bytes
//!   zero, keys (u64 logical blocks) from @8, pointers (u64 filesystem blocks) from
//!   `@8 + 8 * max` where `max = (fork_bytes - 8) / 16`.
//! - Device (4): nothing in the fork; the device number is `rdev`. Data fork only.
//! - In the attr fork, Btree (3) is the attribute index root (`xattr::XattrIndexRoot`,
//!   16 bytes) instead of an extent tree root.

use std::ops::Range;

use crate::FormatError;

/// Bytes of an attr fork in index form (`xattr::XattrIndexRoot`).
const XATTR_INDEX_ROOT_BYTES: usize = 16;
use crate::extent::{Extent, decode_extents, encode_extents};
use crate::header::{Expected, MetaHeader, verify_header};
use crate::limits::{
    BTREE_LEVELS_MAX, EXTENT_LEN_MAX, FILE_BLOCK_MAX, FS_BLOCK_MAX, INODE_SIZE_MAX, INODE_SIZE_MIN,
    SYMLINK_LEN_MAX,
};
use crate::ondisk::{
    OnDisk, bad_field, check_zero, get_i64, get_u8, get_u16, get_u32, get_u64, need, put_i64,
    put_u8, put_u16, put_u32, put_u64,
};
use crate::types::{NULL_AG_INODE, NULL_BLOCK};

/// Bytes of the inode core; the literal area starts here.
pub const INODE_CORE_SIZE: usize = 176;

/// Mode bits of the file type (`S_IFMT`) and the types themselves.
pub const MODE_TYPE_MASK: u16 = 0o170_000;
pub const MODE_PERMISSION_MASK: u16 = 0o7777;

/// Inode flags.
pub const INODE_FLAG_IMMUTABLE: u32 = 1 << 0;
pub const INODE_FLAG_APPEND: u32 = 1 << 1;
pub const INODE_FLAG_SYNC: u32 = 1 << 2;
pub const INODE_FLAG_NOATIME: u32 = 1 << 3;
pub const INODE_FLAG_NODUMP: u32 = 1 << 4;
/// Directory: new files inherit the directory's extent size hint.
pub const INODE_FLAG_EXTSIZE_INHERIT: u32 = 1 << 5;
/// Directory: new files inherit the directory's project id (and new directories this flag).
pub const INODE_FLAG_PROJECT_INHERIT: u32 = 1 << 6;
/// Regular file (reflink feature): its data fork may map blocks other files map too, so
/// freeing or writing its blocks goes through the refcount tree.
pub const INODE_FLAG_REFLINK: u32 = 1 << 8;
/// Directory (reflink feature): new files inherit its CoW extent size hint.
pub const INODE_FLAG_COWEXTSIZE: u32 = 1 << 9;
pub const INODE_FLAGS_KNOWN: u32 = ((1 << 7) - 1) | INODE_FLAG_REFLINK | INODE_FLAG_COWEXTSIZE;
/// Flags only a directory may carry.
pub const INODE_FLAGS_DIRECTORY_ONLY: u32 =
    INODE_FLAG_EXTSIZE_INHERIT | INODE_FLAG_PROJECT_INHERIT | INODE_FLAG_COWEXTSIZE;

/// The flags' names, in bit order (`flag_names`).
const FLAG_NAMES: [(u32, &str); 9] = [
    (INODE_FLAG_IMMUTABLE, "immutable"),
    (INODE_FLAG_APPEND, "append"),
    (INODE_FLAG_SYNC, "sync"),
    (INODE_FLAG_NOATIME, "noatime"),
    (INODE_FLAG_NODUMP, "nodump"),
    (INODE_FLAG_EXTSIZE_INHERIT, "extsize-inherit"),
    (INODE_FLAG_PROJECT_INHERIT, "project-inherit"),
    (INODE_FLAG_REFLINK, "reflink"),
    (INODE_FLAG_COWEXTSIZE, "cowextsize-inherit"),
];

/// The names of the flags set in `flags` (unknown bits as their hex value).
pub fn flag_names(flags: u32) -> Vec<String> {
    let mut names: Vec<String> = FLAG_NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| (*name).to_string())
        .collect();
    if flags & !INODE_FLAGS_KNOWN != 0 {
        names.push(format!("{:#x}", flags & !INODE_FLAGS_KNOWN));
    }
    names
}

const NANOSECONDS_PER_SECOND: u32 = 1_000_000_000;

/// File type, as encoded in the mode and in directory entries (the `u8` code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    Unknown = 0,
    Regular = 1,
    Directory = 2,
    CharDevice = 3,
    BlockDevice = 4,
    Fifo = 5,
    Socket = 6,
    Symlink = 7,
}

impl FileType {
    pub const fn from_code(code: u8) -> Option<FileType> {
        Some(match code {
            0 => Self::Unknown,
            1 => Self::Regular,
            2 => Self::Directory,
            3 => Self::CharDevice,
            4 => Self::BlockDevice,
            5 => Self::Fifo,
            6 => Self::Socket,
            7 => Self::Symlink,
            _ => return None,
        })
    }

    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The type named by a mode's `S_IFMT` bits; `None` for unknown bits (and for 0).
    pub const fn from_mode(mode: u16) -> Option<FileType> {
        Some(match mode & MODE_TYPE_MASK {
            0o100_000 => Self::Regular,
            0o040_000 => Self::Directory,
            0o020_000 => Self::CharDevice,
            0o060_000 => Self::BlockDevice,
            0o010_000 => Self::Fifo,
            0o140_000 => Self::Socket,
            0o120_000 => Self::Symlink,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this type (0 for `Unknown`).
    pub const fn mode_bits(self) -> u16 {
        match self {
            Self::Unknown => 0,
            Self::Regular => 0o100_000,
            Self::Directory => 0o040_000,
            Self::CharDevice => 0o020_000,
            Self::BlockDevice => 0o060_000,
            Self::Fifo => 0o010_000,
            Self::Socket => 0o140_000,
            Self::Symlink => 0o120_000,
        }
    }
}

/// How a fork stores its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForkFormat {
    Local = 1,
    Extents = 2,
    Btree = 3,
    Device = 4,
}

impl ForkFormat {
    pub const fn from_code(code: u8) -> Option<ForkFormat> {
        Some(match code {
            1 => Self::Local,
            2 => Self::Extents,
            3 => Self::Btree,
            4 => Self::Device,
            _ => return None,
        })
    }
}

/// A timestamp: seconds since the epoch and nanoseconds (< 1e9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanoseconds: u32,
}

/// The decoded inode core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeCore {
    pub header: MetaHeader,
    pub mode: u16,
    pub data_format: ForkFormat,
    /// `None`: the inode has no attr fork (`attr_offset` is 0).
    pub attr_format: Option<ForkFormat>,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub generation: u32,
    pub flags: u32,
    pub size: u64,
    pub block_count: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub btime: Timestamp,
    /// Blocks; 0 = none. A regular file allocates in whole units of it; a directory holds
    /// it only with EXTSIZE_INHERIT, for the files made in it.
    pub extent_size_hint: u32,
    pub next_unlinked: u32,
    pub data_extent_count: u32,
    pub attr_extent_count: u16,
    pub attr_offset: u16,
    pub rdev: u32,
    /// Blocks a copy-on-write allocates at least (aligned), 0 = the filesystem's choice.
    pub cow_extent_size_hint: u32,
    pub project_id: u32,
}

/// Bytes of the literal area of an inode of `inode_size` bytes.
pub const fn literal_bytes(inode_size: u32) -> usize {
    (inode_size as usize).saturating_sub(INODE_CORE_SIZE)
}

impl InodeCore {
    /// The file type, or `None` for a free inode (mode 0).
    pub fn file_type(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }

    /// Byte range of the data fork within the inode.
    pub fn data_fork_range(&self, inode_size: u32) -> Range<usize> {
        let end = match self.attr_offset {
            0 => INODE_CORE_SIZE + literal_bytes(inode_size),
            offset => INODE_CORE_SIZE + 8 * usize::from(offset),
        };
        INODE_CORE_SIZE..end
    }

    /// Byte range of the attr fork within the inode, if it has one.
    pub fn attr_fork_range(&self, inode_size: u32) -> Option<Range<usize>> {
        (self.attr_offset != 0).then(|| {
            INODE_CORE_SIZE + 8 * usize::from(self.attr_offset)
                ..INODE_CORE_SIZE + literal_bytes(inode_size)
        })
    }

    /// Verifies the header against `expected` (blkno and owner = the inode number), then
    /// decodes and checks the core against the inode's own size (`raw.len()`).
    pub fn read(raw: &[u8], expected: &Expected) -> Result<InodeCore, FormatError> {
        verify_header(raw, expected)?;
        let core = Self::decode(raw)?;
        core.check(raw.len() as u32)?;
        Ok(core)
    }

    /// Checks the core against the inode size: the forks fit, formats suit the file type, and
    /// the extent counts and local sizes fit their forks.
    pub fn check(&self, inode_size: u32) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u64, why| bad_field(Self::NAME, at, field, value, why);
        if !inode_size.is_power_of_two() || !(INODE_SIZE_MIN..=INODE_SIZE_MAX).contains(&inode_size)
        {
            return Err(bad(
                "inode_size",
                inode_size.into(),
                "not a valid inode size",
            ));
        }
        if self.header.owner != self.header.blkno {
            return Err(bad(
                "owner",
                self.header.owner,
                "differs from the inode number",
            ));
        }
        let literal = literal_bytes(inode_size);
        if 8 * usize::from(self.attr_offset) >= literal {
            return Err(bad(
                "attr_offset",
                self.attr_offset.into(),
                "past the literal area",
            ));
        }
        self.check_formats()?;
        self.check_flags()?;
        let data_bytes = self.data_fork_range(inode_size).len();
        self.check_fork_fill(self.data_format, data_bytes, self.data_extent_count, "data")?;
        if let (Some(format), Some(range)) = (self.attr_format, self.attr_fork_range(inode_size)) {
            let count = u32::from(self.attr_extent_count);
            self.check_fork_fill(format, range.len(), count, "attr")?;
        }
        Ok(())
    }

    fn check_formats(&self) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u64, why| bad_field(Self::NAME, at, field, value, why);
        let data = self.data_format;
        let allowed = match self.file_type() {
            None => data == ForkFormat::Extents,
            Some(FileType::Regular) => matches!(data, ForkFormat::Extents | ForkFormat::Btree),
            Some(FileType::Directory) => data != ForkFormat::Device,
            Some(FileType::Symlink) => matches!(data, ForkFormat::Local | ForkFormat::Extents),
            Some(_) => data == ForkFormat::Device,
        };
        if !allowed {
            return Err(bad(
                "data_format",
                data as u64,
                "not allowed for this file type",
            ));
        }
        if self.file_type().is_none() && (self.nlink != 0 || self.data_extent_count != 0) {
            return Err(bad(
                "nlink",
                self.nlink.into(),
                "a free inode has no links or extents",
            ));
        }
        if self.file_type() == Some(FileType::Symlink) && self.size > SYMLINK_LEN_MAX as u64 {
            return Err(bad(
                "size",
                self.size,
                "symlink target longer than SYMLINK_LEN_MAX",
            ));
        }
        if self.attr_format == Some(ForkFormat::Device) {
            return Err(bad("attr_format", 4, "an attr fork cannot be a device"));
        }
        if self.attr_format.is_some() != (self.attr_offset != 0) {
            return Err(bad(
                "attr_offset",
                self.attr_offset.into(),
                "disagrees with attr_format",
            ));
        }
        Ok(())
    }

    /// Flags and the extent size hint suit the file type: the inheriting flags belong to
    /// directories, a hint to regular files and to directories that pass it on (with
    /// EXTSIZE_INHERIT, which needs one), and a hint fits in one extent. A free inode's
    /// leftovers are not checked (a new inode starts from zero).
    fn check_flags(&self) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u64, why| bad_field(Self::NAME, at, field, value, why);
        let Some(file_type) = self.file_type() else {
            return Ok(());
        };
        let flags = self.flags;
        let directory = file_type == FileType::Directory;
        if !directory && flags & INODE_FLAGS_DIRECTORY_ONLY != 0 {
            return Err(bad(
                "flags",
                flags.into(),
                "inheriting flags on a non-directory",
            ));
        }
        let hint = self.extent_size_hint;
        let inherits = flags & INODE_FLAG_EXTSIZE_INHERIT != 0;
        let hint_allowed = match file_type {
            FileType::Regular => true,
            FileType::Directory => inherits,
            _ => false,
        };
        if hint != 0 && !hint_allowed {
            return Err(bad(
                "extent_size_hint",
                hint.into(),
                "a hint on an inode that cannot use it",
            ));
        }
        if inherits && hint == 0 {
            return Err(bad("flags", flags.into(), "EXTSIZE_INHERIT without a hint"));
        }
        if hint > EXTENT_LEN_MAX {
            return Err(bad(
                "extent_size_hint",
                hint.into(),
                "longer than an extent",
            ));
        }
        self.check_cow_hint(file_type)
    }

    /// The CoW extent size hint follows the same rules as the extent size hint, with
    /// COWEXTSIZE as a directory's flag for passing it on.
    fn check_cow_hint(&self, file_type: FileType) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u64, why| bad_field(Self::NAME, at, field, value, why);
        let hint = self.cow_extent_size_hint;
        let inherits = self.flags & INODE_FLAG_COWEXTSIZE != 0;
        let allowed = match file_type {
            FileType::Regular => true,
            FileType::Directory => inherits,
            _ => false,
        };
        if hint != 0 && !allowed {
            let why = "a CoW hint on an inode that cannot use it";
            return Err(bad("cow_extent_size_hint", hint.into(), why));
        }
        if inherits && hint == 0 {
            return Err(bad("flags", self.flags.into(), "COWEXTSIZE without a hint"));
        }
        if hint > EXTENT_LEN_MAX {
            let why = "longer than an extent";
            return Err(bad("cow_extent_size_hint", hint.into(), why));
        }
        Ok(())
    }

    fn check_fork_fill(
        &self,
        format: ForkFormat,
        fork_bytes: usize,
        extent_count: u32,
        fork: &'static str,
    ) -> Result<(), FormatError> {
        let at = self.header.blkno;
        let bad = |field, value: u64, why| bad_field(Self::NAME, at, field, value, why);
        let field = if fork == "data" {
            "data_extent_count"
        } else {
            "attr_extent_count"
        };
        match format {
            ForkFormat::Local if fork == "data" && self.size > fork_bytes as u64 => Err(bad(
                "size",
                self.size,
                "local data longer than the data fork",
            )),
            ForkFormat::Extents if extent_count as usize > fork_bytes / Extent::SIZE => Err(bad(
                field,
                extent_count.into(),
                "more extents than the fork holds",
            )),
            ForkFormat::Btree if fork == "attr" && fork_bytes < XATTR_INDEX_ROOT_BYTES => Err(bad(
                field,
                fork_bytes as u64,
                "fork too small for an attribute index root",
            )),
            ForkFormat::Btree if fork == "data" && fork_bytes < BmapRoot::HEADER_BYTES + 16 => Err(
                bad(field, fork_bytes as u64, "fork too small for a tree root"),
            ),
            ForkFormat::Local | ForkFormat::Device if extent_count != 0 => Err(bad(
                field,
                extent_count.into(),
                "a local or device fork has no extents",
            )),
            _ => Ok(()),
        }
    }
}

fn get_timestamp(raw: &[u8], seconds_at: usize, nanoseconds_at: usize) -> Timestamp {
    Timestamp {
        seconds: get_i64(raw, seconds_at),
        nanoseconds: get_u32(raw, nanoseconds_at),
    }
}

impl OnDisk for InodeCore {
    const SIZE: usize = INODE_CORE_SIZE;
    const NAME: &'static str = "inode";

    fn encode(&self, out: &mut [u8]) {
        self.header.encode(out);
        put_u16(out, 48, self.mode);
        put_u8(out, 50, self.data_format as u8);
        put_u8(out, 51, self.attr_format.map_or(0, |f| f as u8));
        put_u32(out, 52, self.uid);
        put_u32(out, 56, self.gid);
        put_u32(out, 60, self.nlink);
        put_u32(out, 64, self.generation);
        put_u32(out, 68, self.flags);
        put_u64(out, 72, self.size);
        put_u64(out, 80, self.block_count);
        let times = [self.atime, self.mtime, self.ctime, self.btime];
        for (index, time) in times.iter().enumerate() {
            put_i64(out, 88 + 8 * index, time.seconds);
            put_u32(out, 120 + 4 * index, time.nanoseconds);
        }
        put_u32(out, 136, self.extent_size_hint);
        put_u32(out, 140, self.next_unlinked);
        put_u32(out, 144, self.data_extent_count);
        put_u16(out, 148, self.attr_extent_count);
        put_u16(out, 150, self.attr_offset);
        put_u32(out, 152, self.rdev);
        put_u32(out, 156, self.project_id);
        put_u32(out, 160, self.cow_extent_size_hint);
        out[INODE_SPARE].fill(0);
    }

    fn decode(raw: &[u8]) -> Result<Self, FormatError> {
        need(Self::NAME, raw, Self::SIZE)?;
        let header = MetaHeader::decode(raw)?;
        let bad = |field, value: u64, why| bad_field(Self::NAME, header.blkno, field, value, why);
        let mode = get_u16(raw, 48);
        if mode != 0 && FileType::from_mode(mode).is_none() {
            return Err(bad("mode", mode.into(), "unknown file type"));
        }
        check_zero(Self::NAME, header.blkno, "spare", raw, INODE_SPARE)?;
        let data_format = ForkFormat::from_code(get_u8(raw, 50))
            .ok_or_else(|| bad("data_format", get_u8(raw, 50).into(), "unknown fork format"))?;
        let attr_code = get_u8(raw, 51);
        let attr_format = match attr_code {
            0 => None,
            code => Some(
                ForkFormat::from_code(code)
                    .ok_or_else(|| bad("attr_format", code.into(), "unknown fork format"))?,
            ),
        };
        let flags = get_u32(raw, 68);
        if flags & !INODE_FLAGS_KNOWN != 0 {
            return Err(bad("flags", flags.into(), "unknown inode flags"));
        }
        let times = [0, 1, 2, 3].map(|index| get_timestamp(raw, 88 + 8 * index, 120 + 4 * index));
        for time in times {
            if time.nanoseconds >= NANOSECONDS_PER_SECOND {
                return Err(bad("nanoseconds", time.nanoseconds.into(), "not below 1e9"));
            }
        }
        let [atime, mtime, ctime, btime] = times;
        Ok(Self {
            header,
            mode,
            data_format,
            attr_format,
            uid: get_u32(raw, 52),
            gid: get_u32(raw, 56),
            nlink: get_u32(raw, 60),
            generation: get_u32(raw, 64),
            flags,
            size: get_u64(raw, 72),
            block_count: get_u64(raw, 80),
            atime,
            mtime,
            ctime,
            btime,
            extent_size_hint: get_u32(raw, 136),
            next_unlinked: get_u32(raw, 140),
            data_extent_count: get_u32(raw, 144),
            attr_extent_count: get_u16(raw, 148),
            attr_offset: get_u16(raw, 150),
            rdev: get_u32(raw, 152),
            project_id: get_u32(raw, 156),
            cow_extent_size_hint: get_u32(raw, 160),
        })
    }
}

/// The spare bytes of the inode core (zero; reserved for growth).
pub const INODE_SPARE: std::ops::Range<usize> = 164..INODE_CORE_SIZE;

/// Zeroes what the verifiers refuse in the core of inode `raw` and a kept inode can do
/// without: the spare bytes, unknown flags, flags its file type may not carry, and an
/// extent size hint or CoW extent size hint it cannot use (with the flag that passes it
/// on). Returns the names of
/// the fields it changed; the caller re-stamps the CRC. Repair keeps an inode whose only
/// faults these are. A hint above `hint_blocks_max` (`extent_size_hint_max`) goes too.
pub fn clear_inode_reserved(raw: &mut [u8], hint_blocks_max: u32) -> Vec<&'static str> {
    let mut cleared = Vec::new();
    let Some(spare) = raw.get_mut(INODE_SPARE) else {
        return cleared;
    };
    if spare.iter().any(|&b| b != 0) {
        spare.fill(0);
        cleared.push("spare bytes");
    }
    let file_type = FileType::from_mode(get_u16(raw, 48));
    let mut flags = get_u32(raw, 68);
    let mut hint = get_u32(raw, 136);
    if flags & !INODE_FLAGS_KNOWN != 0 {
        flags &= INODE_FLAGS_KNOWN;
        cleared.push("unknown flags");
    }
    if file_type.is_some_and(|t| t != FileType::Directory)
        && flags & INODE_FLAGS_DIRECTORY_ONLY != 0
    {
        flags &= !INODE_FLAGS_DIRECTORY_ONLY;
        cleared.push("directory flags");
    }
    let inherits = flags & INODE_FLAG_EXTSIZE_INHERIT != 0;
    let fits = hint <= EXTENT_LEN_MAX.min(hint_blocks_max);
    let usable = match file_type {
        Some(FileType::Regular) => fits,
        Some(FileType::Directory) => (inherits && hint != 0 && fits) || (!inherits && hint == 0),
        Some(_) => hint == 0,
        None => true,
    };
    if !usable {
        hint = 0;
        flags &= !INODE_FLAG_EXTSIZE_INHERIT;
        cleared.push("extent size hint");
    }
    let cow_hint = get_u32(raw, 160);
    let inherits = flags & INODE_FLAG_COWEXTSIZE != 0;
    let fits = cow_hint <= EXTENT_LEN_MAX.min(hint_blocks_max);
    let usable = match file_type {
        Some(FileType::Regular) => fits,
        Some(FileType::Directory) => {
            (inherits && cow_hint != 0 && fits) || (!inherits && cow_hint == 0)
        }
        Some(_) => cow_hint == 0,
        None => true,
    };
    if !usable {
        flags &= !INODE_FLAG_COWEXTSIZE;
        put_u32(raw, 160, 0);
        cleared.push("CoW extent size hint");
    }
    put_u32(raw, 68, flags);
    put_u32(raw, 136, hint);
    cleared
}

/// The largest extent size hint (blocks) for allocation groups of `ag_blocks` blocks: half
/// an AG (as XFS), so that a whole hint-sized extent can still be found, and no longer
/// than one extent.
pub const fn extent_size_hint_max(ag_blocks: u32) -> u32 {
    let half = ag_blocks / 2;
    if half < EXTENT_LEN_MAX {
        half
    } else {
        EXTENT_LEN_MAX
    }
}

/// The bytes of a Local fork: the first `length` bytes of the fork.
pub fn local_bytes(fork: &[u8], length: u64) -> Result<&[u8], FormatError> {
    usize::try_from(length)
        .ok()
        .and_then(|length| fork.get(..length))
        .ok_or_else(|| bad_field("local fork", NULL_BLOCK, "length", length, "past the fork"))
}

/// The extents of an Extents fork.
pub fn fork_extents(fork: &[u8], count: u32) -> Result<Vec<Extent>, FormatError> {
    decode_extents(fork, count as usize)
}

/// Writes the extents of an Extents fork, zeroing the rest of the fork.
pub fn put_fork_extents(extents: &[Extent], fork: &mut [u8]) -> Result<(), FormatError> {
    encode_extents(extents, fork)?;
    fork[extents.len() * Extent::SIZE..].fill(0);
    Ok(())
}

/// The root of a file extent tree kept in an inode fork (Btree format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmapRoot {
    /// Level of the root, >= 1 (its children are at `level - 1`).
    pub level: u16,
    /// First logical block of each child's subtree.
    pub keys: Vec<u64>,
    /// Filesystem block of each child.
    pub pointers: Vec<u64>,
}

impl BmapRoot {
    pub const HEADER_BYTES: usize = 8;

    /// Key/pointer pairs a fork of `fork_bytes` holds.
    pub const fn capacity(fork_bytes: usize) -> usize {
        fork_bytes.saturating_sub(Self::HEADER_BYTES) / 16
    }

    pub fn decode(fork: &[u8]) -> Result<BmapRoot, FormatError> {
        const NAME: &str = "file extent tree root";
        need(NAME, fork, Self::HEADER_BYTES)?;
        let bad = |field, value: u64, why| bad_field(NAME, NULL_BLOCK, field, value, why);
        let level = get_u16(fork, 0);
        check_zero(NAME, NULL_BLOCK, "pad", fork, 4..Self::HEADER_BYTES)?;
        if level == 0 || u32::from(level) >= BTREE_LEVELS_MAX {
            return Err(bad("level", level.into(), "outside 1..BTREE_LEVELS_MAX"));
        }
        let count = usize::from(get_u16(fork, 2));
        let max = Self::capacity(fork.len());
        if count > max {
            return Err(bad("count", count as u64, "more than the fork holds"));
        }
        let pointers_at = Self::HEADER_BYTES + 8 * max;
        let mut keys = Vec::with_capacity(count);
        let mut pointers = Vec::with_capacity(count);
        for index in 0..count {
            let key = get_u64(fork, Self::HEADER_BYTES + 8 * index);
            let pointer = get_u64(fork, pointers_at + 8 * index);
            if key > FILE_BLOCK_MAX || keys.last().is_some_and(|&last| key <= last) {
                return Err(bad("key", key, "out of range or out of order"));
            }
            if pointer > FS_BLOCK_MAX {
                return Err(bad("pointer", pointer, "past FS_BLOCK_MAX"));
            }
            keys.push(key);
            pointers.push(pointer);
        }
        Ok(BmapRoot {
            level,
            keys,
            pointers,
        })
    }

    /// Encodes into the whole fork (zeroing unused slots); fails when it does not fit.
    pub fn encode(&self, fork: &mut [u8]) -> Result<(), FormatError> {
        let max = Self::capacity(fork.len());
        let count = self.keys.len();
        if count != self.pointers.len() || count > max || count > usize::from(u16::MAX) {
            let why = "keys and pointers differ in number or do not fit the fork";
            return Err(bad_field(
                "file extent tree root",
                NULL_BLOCK,
                "count",
                count as u64,
                why,
            ));
        }
        fork.fill(0);
        put_u16(fork, 0, self.level);
        put_u16(fork, 2, count as u16);
        let pointers_at = Self::HEADER_BYTES + 8 * max;
        for (index, (&key, &pointer)) in self.keys.iter().zip(&self.pointers).enumerate() {
            put_u64(fork, Self::HEADER_BYTES + 8 * index, key);
            put_u64(fork, pointers_at + 8 * index, pointer);
        }
        Ok(())
    }
}

/// A free inode's core: what mkfs writes into every slot of a new chunk.
pub fn free_inode_core(header: MetaHeader, generation: u32) -> InodeCore {
    InodeCore {
        header,
        mode: 0,
        data_format: ForkFormat::Extents,
        attr_format: None,
        uid: 0,
        gid: 0,
        nlink: 0,
        generation,
        flags: 0,
        size: 0,
        block_count: 0,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        btime: Timestamp::default(),
        extent_size_hint: 0,
        next_unlinked: NULL_AG_INODE,
        data_extent_count: 0,
        attr_extent_count: 0,
        attr_offset: 0,
        rdev: 0,
        cow_extent_size_hint: 0,
        project_id: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{MetaKind, stamp};
    use crate::testing::UUID;
    use crate::types::FsBlock;
    use proptest::prelude::*;

    const INO: u64 = 4160;

    fn sample(mode: u16, data_format: ForkFormat) -> InodeCore {
        InodeCore {
            mode,
            data_format,
            nlink: 1,
            ..free_inode_core(MetaHeader::new(MetaKind::Inode, INO, UUID, INO), 1)
        }
    }

    // Checks that a stamped inode with extents and an attr fork reads back.
    #[test]
    fn stamped_inode_reads_back() {
        let mut core = sample(0o100_644, ForkFormat::Extents);
        core.attr_format = Some(ForkFormat::Local);
        core.attr_offset = 32;
        core.data_extent_count = 2;
        let extents = [
            Extent::new(0, FsBlock(100), 8, false).unwrap(),
            Extent::new(8, FsBlock(300), 1, true).unwrap(),
        ];
        let mut raw = vec![0u8; 512];
        core.encode(&mut raw);
        put_fork_extents(&extents, &mut raw[core.data_fork_range(512)]).unwrap();
        stamp(&mut raw, None);
        let expected = Expected {
            kind: MetaKind::Inode,
            blkno: INO,
            uuid: UUID,
            owner: Some(INO),
        };
        let mut read = InodeCore::read(&raw, &expected).unwrap();
        read.header.crc = 0;
        assert_eq!(read, core);
        assert_eq!(core.data_fork_range(512), 176..432);
        assert_eq!(core.attr_fork_range(512), Some(432..512));
        let fork = &raw[read.data_fork_range(512)];
        assert_eq!(fork_extents(fork, read.data_extent_count).unwrap(), extents);
    }

    // Checks that nonzero spare bytes are refused (CRC intact) and that clearing them makes
    // the inode read again.
    #[test]
    fn nonzero_spare_bytes_are_refused() {
        let core = sample(0o100_644, ForkFormat::Extents);
        let mut raw = vec![0u8; 512];
        core.encode(&mut raw);
        raw[170] = 9;
        stamp(&mut raw, None);
        let expected = Expected {
            kind: MetaKind::Inode,
            blkno: INO,
            uuid: UUID,
            owner: Some(INO),
        };
        match InodeCore::read(&raw, &expected) {
            Err(FormatError::BadField {
                field: "spare",
                value: 170,
                ..
            }) => {}
            other => panic!("not refused: {other:?}"),
        }
        assert_eq!(clear_inode_reserved(&mut raw, u32::MAX), ["spare bytes"]);
        stamp(&mut raw, None);
        assert!(InodeCore::read(&raw, &expected).is_ok());
    }

    // Checks that flags and hints the file type cannot carry are refused, and that clearing
    // the reserved parts makes such an inode read again with its valid flags kept.
    #[test]
    fn flags_must_suit_the_type() {
        let refused = |core: InodeCore| match core.check(256) {
            Err(FormatError::BadField { field, .. }) => field,
            other => panic!("accepted or wrong error: {other:?}"),
        };
        let mut file = sample(0o100_644, ForkFormat::Extents);
        file.flags = INODE_FLAG_PROJECT_INHERIT | INODE_FLAG_IMMUTABLE;
        assert_eq!(refused(file), "flags");
        let mut dir = sample(0o040_755, ForkFormat::Local);
        dir.flags = INODE_FLAG_EXTSIZE_INHERIT;
        assert_eq!(refused(dir), "flags");
        dir.flags = 0;
        dir.extent_size_hint = 8;
        assert_eq!(refused(dir), "extent_size_hint");
        let mut link = sample(0o120_777, ForkFormat::Local);
        link.extent_size_hint = 8;
        assert_eq!(refused(link), "extent_size_hint");
        file.flags = 0;
        file.extent_size_hint = EXTENT_LEN_MAX + 1;
        assert_eq!(refused(file), "extent_size_hint");
        dir.flags = INODE_FLAG_EXTSIZE_INHERIT | INODE_FLAG_PROJECT_INHERIT | INODE_FLAG_SYNC;
        assert!(dir.check(256).is_ok());
        let expected = Expected {
            kind: MetaKind::Inode,
            blkno: INO,
            uuid: UUID,
            owner: Some(INO),
        };
        let mut bad_file = sample(0o100_644, ForkFormat::Extents);
        bad_file.flags = INODE_FLAG_APPEND | INODE_FLAG_EXTSIZE_INHERIT;
        bad_file.extent_size_hint = EXTENT_LEN_MAX + 1;
        bad_file.project_id = 7;
        let mut raw = vec![0u8; 256];
        bad_file.encode(&mut raw);
        put_u32(&mut raw, 68, bad_file.flags | 1 << 30);
        stamp(&mut raw, None);
        assert!(InodeCore::read(&raw, &expected).is_err());
        let cleared = clear_inode_reserved(&mut raw, u32::MAX);
        assert_eq!(
            cleared,
            ["unknown flags", "directory flags", "extent size hint"]
        );
        stamp(&mut raw, None);
        let read = InodeCore::read(&raw, &expected).unwrap();
        assert_eq!(read.flags, INODE_FLAG_APPEND);
        assert_eq!((read.extent_size_hint, read.project_id), (0, 7));
        assert!(clear_inode_reserved(&mut raw, u32::MAX).is_empty());
        bad_file.flags = INODE_FLAG_APPEND;
        bad_file.extent_size_hint = 64;
        bad_file.encode(&mut raw);
        assert_eq!(clear_inode_reserved(&mut raw, 32), ["extent size hint"]);
        assert_eq!(extent_size_hint_max(100), 50);
        let names = flag_names(INODE_FLAG_IMMUTABLE | INODE_FLAG_PROJECT_INHERIT | 1 << 10);
        assert_eq!(names, ["immutable", "project-inherit", "0x400"]);
        let names = flag_names(INODE_FLAG_REFLINK | INODE_FLAG_COWEXTSIZE);
        assert_eq!(names, ["reflink", "cowextsize-inherit"]);
        assert_eq!(extent_size_hint_max(u32::MAX), EXTENT_LEN_MAX);
    }

    // Checks that a CoW extent size hint must suit the type as the extent size hint does
    // (a directory's only with COWEXTSIZE, which needs one), and that clearing the
    // reserved parts takes away only what breaks the rules.
    #[test]
    fn cow_hint_must_suit_the_type() {
        let refused = |core: InodeCore| match core.check(256) {
            Err(FormatError::BadField { field, .. }) => field,
            other => panic!("accepted or wrong error: {other:?}"),
        };
        let mut file = sample(0o100_644, ForkFormat::Extents);
        file.flags = INODE_FLAG_REFLINK;
        file.cow_extent_size_hint = 16;
        assert!(file.check(256).is_ok());
        file.flags |= INODE_FLAG_COWEXTSIZE;
        assert_eq!(refused(file), "flags");
        let mut dir = sample(0o040_755, ForkFormat::Local);
        dir.cow_extent_size_hint = 16;
        assert_eq!(refused(dir), "cow_extent_size_hint");
        dir.flags = INODE_FLAG_COWEXTSIZE;
        assert!(dir.check(256).is_ok());
        dir.cow_extent_size_hint = 0;
        assert_eq!(refused(dir), "flags");
        let mut link = sample(0o120_777, ForkFormat::Local);
        link.cow_extent_size_hint = 16;
        assert_eq!(refused(link), "cow_extent_size_hint");
        file.flags = 0;
        file.cow_extent_size_hint = EXTENT_LEN_MAX + 1;
        assert_eq!(refused(file), "cow_extent_size_hint");
        let mut raw = vec![0u8; 256];
        file.cow_extent_size_hint = 64;
        file.encode(&mut raw);
        assert_eq!(clear_inode_reserved(&mut raw, 32), ["CoW extent size hint"]);
        assert_eq!(get_u32(&raw, 160), 0);
        dir.cow_extent_size_hint = 16;
        dir.encode(&mut raw);
        assert_eq!(clear_inode_reserved(&mut raw, 32), Vec::<&str>::new());
        put_u32(&mut raw, 160, 0);
        assert_eq!(clear_inode_reserved(&mut raw, 32), ["CoW extent size hint"]);
        assert_eq!(get_u32(&raw, 68) & INODE_FLAG_COWEXTSIZE, 0);
    }

    // Checks that fork formats must suit the file type and counts must fit the fork.
    #[test]
    fn formats_must_suit_the_type() {
        let field = |core: InodeCore| match core.check(256) {
            Err(FormatError::BadField { field, .. }) => field,
            other => panic!("accepted or wrong error: {other:?}"),
        };
        assert_eq!(field(sample(0o100_644, ForkFormat::Local)), "data_format");
        assert_eq!(field(sample(0o020_644, ForkFormat::Extents)), "data_format");
        assert_eq!(field(sample(0o120_777, ForkFormat::Btree)), "data_format");
        let mut many = sample(0o100_644, ForkFormat::Extents);
        many.data_extent_count = 6;
        assert_eq!(field(many), "data_extent_count");
        let mut long_dir = sample(0o040_755, ForkFormat::Local);
        long_dir.size = 81;
        assert_eq!(field(long_dir), "size");
        let mut attr = sample(0o040_755, ForkFormat::Local);
        attr.attr_offset = 4;
        assert_eq!(field(attr), "attr_offset");
        attr.attr_format = Some(ForkFormat::Device);
        assert_eq!(field(attr), "attr_format");
        assert!(sample(0o060_600, ForkFormat::Device).check(256).is_ok());
        assert!(
            free_inode_core(MetaHeader::new(MetaKind::Inode, 9, UUID, 9), 0)
                .check(256)
                .is_ok()
        );
        let mut raw = sample(0o100_644, ForkFormat::Extents).to_bytes();
        raw[120..124].copy_from_slice(&NANOSECONDS_PER_SECOND.to_le_bytes());
        assert!(InodeCore::decode(&raw).is_err());
    }

    fn any_time() -> impl Strategy<Value = Timestamp> {
        (any::<i64>(), 0u32..NANOSECONDS_PER_SECOND).prop_map(|(seconds, nanoseconds)| Timestamp {
            seconds,
            nanoseconds,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn inode_core_round_trip(
            kind in 0usize..8, perm in 0u16..0o7777, ids: (u32, u32, u32, u32), flags in 0u32..128,
            reflink_flags in 0u32..4, cow_extent_size_hint: u32,
            sizes: (u64, u64), times in proptest::array::uniform4(any_time()),
            counts: (u32, u32, u16, u16), rdev: u32, attr in 0u8..4, project_id: u32,
        ) {
            let types = [
                0u16, 0o100_000, 0o040_000, 0o020_000, 0o060_000, 0o010_000, 0o140_000, 0o120_000,
            ];
            let core = InodeCore {
                header: MetaHeader::new(MetaKind::Inode, INO, UUID, INO),
                mode: if kind == 0 { 0 } else { types[kind] | perm },
                data_format: ForkFormat::from_code(1 + (kind as u8 % 4)).unwrap(),
                attr_format: ForkFormat::from_code(attr),
                uid: ids.0, gid: ids.1, nlink: ids.2, generation: ids.3,
                flags: flags | reflink_flags << 8,
                size: sizes.0, block_count: sizes.1,
                atime: times[0], mtime: times[1], ctime: times[2], btime: times[3],
                extent_size_hint: counts.0, next_unlinked: counts.1,
                data_extent_count: counts.0 / 2, attr_extent_count: counts.2,
                attr_offset: counts.3, rdev, cow_extent_size_hint, project_id,
            };
            prop_assert_eq!(InodeCore::decode(&core.to_bytes()).unwrap(), core);
        }

        #[test]
        fn bmap_root_round_trip(
            level in 1u16..12, mut keys in proptest::collection::vec(0u64..=FILE_BLOCK_MAX, 0..10),
        ) {
            keys.sort_unstable();
            keys.dedup();
            let pointers: Vec<u64> = keys.iter().map(|k| k & FS_BLOCK_MAX).collect();
            let root = BmapRoot { level, keys, pointers };
            let mut fork = vec![0u8; 8 + 16 * 10];
            root.encode(&mut fork).unwrap();
            prop_assert_eq!(BmapRoot::decode(&fork).unwrap(), root);
        }

        #[test]
        fn inode_random_bytes_never_panic(
            raw in proptest::collection::vec(any::<u8>(), 0..600), size_log in 8u32..12,
        ) {
            if let Ok(core) = InodeCore::decode(&raw) {
                let _ = core.check(1 << size_log);
                let _ = core.data_fork_range(1 << size_log);
                let _ = core.attr_fork_range(1 << size_log);
            }
            let _ = BmapRoot::decode(&raw);
            let _ = local_bytes(&raw, raw.len() as u64 / 2);
            let _ = fork_extents(&raw, raw.len() as u32 / 7);
        }
    }
}
