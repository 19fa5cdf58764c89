//! The Linux interfaces to inode flags and extent size hints: `FS_IOC_GETFLAGS` /
//! `FS_IOC_SETFLAGS` (`chattr`, `lsattr`) with their `FS_*_FL` bits, `FS_IOC_FSGETXATTR` /
//! `FS_IOC_FSSETXATTR` (`xfs_io`, `cairn extsize`) with `struct fsxattr` and its
//! `FS_XFLAG_*` bits, and statx's `STATX_ATTR_*` bits. The kernel sends the four ioctls to
//! the daemon as `FUSE_IOCTL` (fs/fuse/ioctl.c, the fileattr hooks) after checking that
//! the caller owns the inode and, for `i` and `a`, holds CAP_LINUX_IMMUTABLE; the
//! translation to `cairn_fs::FileAttributes` follows XFS's (`xfs_fileattr_set`).

use cairn_fs::{FileAttributes, FileAttributesReport, FileKind, InodeFlags};

/// `FS_IOC_GETFLAGS` and `FS_IOC_SETFLAGS` (64-bit), and their 32-bit forms.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
pub const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
/// `FS_IOC_FSGETXATTR` and `FS_IOC_FSSETXATTR`: `struct fsxattr` out and in.
pub const FS_IOC_FSGETXATTR: u32 = 0x801C_581F;
pub const FS_IOC_FSSETXATTR: u32 = 0x401C_5820;

/// `FS_*_FL`, as `chattr` letters: S, i, a, d, A, P.
const FS_SYNC_FL: u32 = 0x8;
const FS_IMMUTABLE_FL: u32 = 0x10;
const FS_APPEND_FL: u32 = 0x20;
const FS_NODUMP_FL: u32 = 0x40;
const FS_NOATIME_FL: u32 = 0x80;
const FS_PROJINHERIT_FL: u32 = 0x2000_0000;
const FLAGS_KNOWN: u32 =
    FS_SYNC_FL | FS_IMMUTABLE_FL | FS_APPEND_FL | FS_NODUMP_FL | FS_NOATIME_FL | FS_PROJINHERIT_FL;

/// `FS_XFLAG_*`.
const XFLAG_PREALLOC: u32 = 0x2;
const XFLAG_IMMUTABLE: u32 = 0x8;
const XFLAG_APPEND: u32 = 0x10;
const XFLAG_SYNC: u32 = 0x20;
const XFLAG_NOATIME: u32 = 0x40;
const XFLAG_NODUMP: u32 = 0x80;
const XFLAG_PROJINHERIT: u32 = 0x200;
/// A regular file's extent size hint is set.
pub const XFLAG_EXTSIZE: u32 = 0x800;
/// A directory passes its extent size hint on.
pub const XFLAG_EXTSZINHERIT: u32 = 0x1000;
/// A copy-on-write extent size hint is set (a directory's passes on to new inodes).
pub const XFLAG_COWEXTSIZE: u32 = 0x1_0000;
const XFLAG_HASATTR: u32 = 0x8000_0000;
/// Flags a set may carry: the ones cairn keeps, and the read-only ones a get reported.
const XFLAGS_ACCEPTED: u32 = XFLAG_IMMUTABLE
    | XFLAG_APPEND
    | XFLAG_SYNC
    | XFLAG_NOATIME
    | XFLAG_NODUMP
    | XFLAG_PROJINHERIT
    | XFLAG_EXTSIZE
    | XFLAG_EXTSZINHERIT
    | XFLAG_COWEXTSIZE
    | XFLAG_PREALLOC
    | XFLAG_HASATTR;

/// statx's `STATX_ATTR_*` bits for the flags it reports, and the mask of those cairn
/// supports (XFS's three).
const STATX_ATTR_IMMUTABLE: u64 = 0x10;
const STATX_ATTR_APPEND: u64 = 0x20;
const STATX_ATTR_NODUMP: u64 = 0x40;
pub const STATX_ATTRIBUTES_MASK: u64 = STATX_ATTR_IMMUTABLE | STATX_ATTR_APPEND | STATX_ATTR_NODUMP;

/// Bytes of `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize (u32 each)
/// and 8 bytes of padding.
pub const FSXATTR_BYTES: usize = 28;

/// A `u32` of an ioctl's data, which is in the host's byte order.
#[expect(
    clippy::host_endian_bytes,
    reason = "ioctl data is in the host's byte order"
)]
pub fn host_u32(raw: [u8; 4]) -> u32 {
    u32::from_ne_bytes(raw)
}

/// The bytes of a `u32` in an ioctl's data (the host's byte order).
#[expect(
    clippy::host_endian_bytes,
    reason = "ioctl data is in the host's byte order"
)]
pub fn host_bytes(value: u32) -> [u8; 4] {
    value.to_ne_bytes()
}

/// Why a set is refused, as the errno XFS answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A flag cairn does not have (EOPNOTSUPP).
    Unsupported,
    /// A hint without its flag, or a flag on the wrong kind of inode (EINVAL).
    Invalid,
}

/// `struct fsxattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fsxattr {
    pub xflags: u32,
    /// Bytes.
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
}

impl Fsxattr {
    /// Decodes the struct (host byte order, as the ioctl passes it); `None` if short.
    pub fn decode(raw: &[u8]) -> Option<Fsxattr> {
        let word = |index: usize| {
            let bytes = raw.get(4 * index..4 * index + 4)?;
            Some(host_u32(bytes.try_into().ok()?))
        };
        Some(Fsxattr {
            xflags: word(0)?,
            extsize: word(1)?,
            nextents: word(2)?,
            projid: word(3)?,
            cowextsize: word(4)?,
        })
    }

    pub fn encode(&self) -> [u8; FSXATTR_BYTES] {
        let mut out = [0u8; FSXATTR_BYTES];
        let words = [
            self.xflags,
            self.extsize,
            self.nextents,
            self.projid,
            self.cowextsize,
        ];
        for (index, word) in words.iter().enumerate() {
            out[4 * index..4 * index + 4].copy_from_slice(&host_bytes(*word));
        }
        out
    }
}

/// The `FS_*_FL` bits of `flags`.
pub fn flags_of(flags: &InodeFlags) -> u32 {
    [
        (flags.sync, FS_SYNC_FL),
        (flags.immutable, FS_IMMUTABLE_FL),
        (flags.append_only, FS_APPEND_FL),
        (flags.no_dump, FS_NODUMP_FL),
        (flags.no_atime, FS_NOATIME_FL),
        (flags.project_inherit, FS_PROJINHERIT_FL),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .fold(0, |bits, (_, bit)| bits | bit)
}

/// The inode flags `FS_IOC_SETFLAGS` asks for with `bits`: the other attributes stay.
pub fn with_flags(current: &FileAttributes, bits: u32) -> Result<FileAttributes, Refusal> {
    if bits & !FLAGS_KNOWN != 0 {
        return Err(Refusal::Unsupported);
    }
    Ok(FileAttributes {
        flags: InodeFlags {
            sync: bits & FS_SYNC_FL != 0,
            immutable: bits & FS_IMMUTABLE_FL != 0,
            append_only: bits & FS_APPEND_FL != 0,
            no_dump: bits & FS_NODUMP_FL != 0,
            no_atime: bits & FS_NOATIME_FL != 0,
            project_inherit: bits & FS_PROJINHERIT_FL != 0,
        },
        ..*current
    })
}

/// The `struct fsxattr` of an inode of `kind`.
pub fn fsxattr_of(report: &FileAttributesReport, kind: FileKind) -> Fsxattr {
    let attributes = &report.attributes;
    let flags = &attributes.flags;
    let mut xflags = [
        (flags.immutable, XFLAG_IMMUTABLE),
        (flags.append_only, XFLAG_APPEND),
        (flags.sync, XFLAG_SYNC),
        (flags.no_atime, XFLAG_NOATIME),
        (flags.no_dump, XFLAG_NODUMP),
        (flags.project_inherit, XFLAG_PROJINHERIT),
        (report.has_xattrs, XFLAG_HASATTR),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .fold(0, |bits, (_, bit)| bits | bit);
    if attributes.extent_size_hint != 0 {
        xflags |= match kind {
            FileKind::Directory => XFLAG_EXTSZINHERIT,
            _ => XFLAG_EXTSIZE,
        };
    }
    if attributes.cow_extent_size_hint != 0 {
        xflags |= XFLAG_COWEXTSIZE;
    }
    Fsxattr {
        xflags,
        extsize: u32::try_from(attributes.extent_size_hint).unwrap_or(u32::MAX),
        nextents: report.extent_count,
        projid: attributes.project_id,
        cowextsize: u32::try_from(attributes.cow_extent_size_hint).unwrap_or(u32::MAX),
    }
}

/// The attributes `FS_IOC_FSSETXATTR` asks for of an inode of `kind` (it sets them all).
/// A nonzero hint needs its flag (EXTSIZE on a regular file, EXTSZINHERIT on a directory;
/// the kernel has already cleared both for a zero hint and refused each on the other
/// kind); the read-only flags a get reported are ignored. A copy-on-write hint needs
/// COWEXTSIZE, on either kind (the kernel clears the flag for a zero hint); the filesystem
/// refuses one without the reflink feature.
pub fn with_fsxattr(wanted: &Fsxattr, kind: FileKind) -> Result<FileAttributes, Refusal> {
    let xflags = wanted.xflags;
    if xflags & !XFLAGS_ACCEPTED != 0 {
        return Err(Refusal::Unsupported);
    }
    let hint_flag = match kind {
        FileKind::Directory => XFLAG_EXTSZINHERIT,
        _ => XFLAG_EXTSIZE,
    };
    let wrong_flag = (XFLAG_EXTSIZE | XFLAG_EXTSZINHERIT) & !hint_flag;
    let hint_without_flag = wanted.extsize != 0 && xflags & hint_flag == 0;
    let cow_hint_without_flag = wanted.cowextsize != 0 && xflags & XFLAG_COWEXTSIZE == 0;
    if xflags & wrong_flag != 0 || hint_without_flag || cow_hint_without_flag {
        return Err(Refusal::Invalid);
    }
    let extent_size_hint = match xflags & hint_flag {
        0 => 0,
        _ => u64::from(wanted.extsize),
    };
    Ok(FileAttributes {
        flags: InodeFlags {
            immutable: xflags & XFLAG_IMMUTABLE != 0,
            append_only: xflags & XFLAG_APPEND != 0,
            sync: xflags & XFLAG_SYNC != 0,
            no_atime: xflags & XFLAG_NOATIME != 0,
            no_dump: xflags & XFLAG_NODUMP != 0,
            project_inherit: xflags & XFLAG_PROJINHERIT != 0,
        },
        extent_size_hint,
        project_id: wanted.projid,
        cow_extent_size_hint: match xflags & XFLAG_COWEXTSIZE {
            0 => 0,
            _ => u64::from(wanted.cowextsize),
        },
    })
}

/// The statx attribute bits of `flags`.
pub fn statx_attributes(flags: &InodeFlags) -> u64 {
    [
        (flags.immutable, STATX_ATTR_IMMUTABLE),
        (flags.append_only, STATX_ATTR_APPEND),
        (flags.no_dump, STATX_ATTR_NODUMP),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .fold(0, |bits, (_, bit)| bits | bit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(flags: InodeFlags, hint: u64) -> FileAttributesReport {
        FileAttributesReport {
            attributes: FileAttributes {
                flags,
                extent_size_hint: hint,
                project_id: 7,
                cow_extent_size_hint: 0,
            },
            extent_count: 3,
            has_xattrs: true,
        }
    }

    // Every flag goes through both ioctl forms and back; unknown bits are refused.
    #[test]
    fn flags_round_trip_both_forms() {
        for bit in [
            FS_SYNC_FL,
            FS_IMMUTABLE_FL,
            FS_APPEND_FL,
            FS_NODUMP_FL,
            FS_NOATIME_FL,
        ] {
            let set = with_flags(&FileAttributes::default(), bit).unwrap();
            assert_eq!(flags_of(&set.flags), bit);
            let x = fsxattr_of(&report(set.flags, 0), FileKind::Regular);
            let back = with_fsxattr(&x, FileKind::Regular);
            assert_eq!(back.unwrap().flags, set.flags, "{bit:#x}");
        }
        let extents = 0x80000;
        let refused = with_flags(&FileAttributes::default(), extents);
        assert_eq!(refused, Err(Refusal::Unsupported));
    }

    // Hints need the flag of their inode's kind; zero clears; a struct round-trips.
    #[test]
    fn hints_follow_xfs_rules() {
        let file = Fsxattr {
            xflags: XFLAG_EXTSIZE,
            extsize: 1 << 20,
            ..Fsxattr::default()
        };
        let set = with_fsxattr(&file, FileKind::Regular).unwrap();
        assert_eq!(set.extent_size_hint, 1 << 20);
        let invalid = Err(Refusal::Invalid);
        assert_eq!(with_fsxattr(&file, FileKind::Directory), invalid);
        let bare = Fsxattr { xflags: 0, ..file };
        assert_eq!(with_fsxattr(&bare, FileKind::Regular), invalid);
        let dir = Fsxattr {
            xflags: XFLAG_EXTSZINHERIT | XFLAG_PROJINHERIT,
            projid: 42,
            ..file
        };
        let set = with_fsxattr(&dir, FileKind::Directory).unwrap();
        assert!(set.flags.project_inherit);
        assert_eq!((set.extent_size_hint, set.project_id), (1 << 20, 42));
        let got = fsxattr_of(&report(set.flags, 1 << 20), FileKind::Directory);
        assert_eq!(
            got.xflags,
            XFLAG_EXTSZINHERIT | XFLAG_PROJINHERIT | XFLAG_HASATTR
        );
        assert_eq!((got.nextents, got.projid), (3, 7));
        assert_eq!(Fsxattr::decode(&got.encode()), Some(got));
        assert_eq!(Fsxattr::decode(&[0; 8]), None);
    }

    // A CoW hint needs COWEXTSIZE on either kind and reads back with it.
    #[test]
    fn cow_hints_need_their_flag() {
        let wanted = Fsxattr {
            xflags: XFLAG_COWEXTSIZE,
            cowextsize: 1 << 16,
            ..Fsxattr::default()
        };
        for kind in [FileKind::Regular, FileKind::Directory] {
            let set = with_fsxattr(&wanted, kind).unwrap();
            assert_eq!(set.cow_extent_size_hint, 1 << 16);
            let report = FileAttributesReport {
                attributes: set,
                ..FileAttributesReport::default()
            };
            let got = fsxattr_of(&report, kind);
            assert_eq!((got.xflags, got.cowextsize), (XFLAG_COWEXTSIZE, 1 << 16));
        }
        let bare = Fsxattr {
            xflags: 0,
            ..wanted
        };
        assert_eq!(
            with_fsxattr(&bare, FileKind::Regular),
            Err(Refusal::Invalid)
        );
    }
}
