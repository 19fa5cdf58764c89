//! Conversions between FUSE request arguments and the filesystem API's value types.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use cairn_fs::{Attr, Credentials, FileKind, TimeOrNow};
use fuser::{FileAttr, FileType, INodeNo, Request};

/// The FUSE file type of a filesystem file kind.
pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// The file kind encoded in the `S_IFMT` bits of a mknod/create mode, if it is one that
/// `Filesystem::create` makes.
pub fn kind_of_mode(mode: u32) -> Option<FileKind> {
    match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => Some(FileKind::Regular),
        libc::S_IFCHR => Some(FileKind::CharDevice),
        libc::S_IFBLK => Some(FileKind::BlockDevice),
        libc::S_IFIFO => Some(FileKind::Fifo),
        libc::S_IFSOCK => Some(FileKind::Socket),
        _ => None,
    }
}

/// The permission bits (with setuid, setgid and sticky) of a mode.
pub fn permission_bits(mode: u32) -> u16 {
    (mode & 0o7777) as u16
}

/// The FUSE attributes of a filesystem inode.
pub fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.inode),
        size: attr.size,
        blocks: attr.blocks_512,
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.btime,
        kind: file_type(attr.kind),
        perm: attr.mode,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.block_size,
        flags: 0,
    }
}

/// A filesystem time-or-now from a FUSE one.
pub fn time_or_now(time: fuser::TimeOrNow) -> TimeOrNow {
    match time {
        fuser::TimeOrNow::SpecificTime(time) => TimeOrNow::Time(time),
        fuser::TimeOrNow::Now => TimeOrNow::Now,
    }
}

/// A name as the filesystem takes it.
pub fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

/// The credentials of the process that made `request`. FUSE passes no supplementary
/// groups, so for callers other than root they are read from `/proc/PID/status`; a
/// process that has gone already simply has none.
pub fn credentials(request: &Request) -> Credentials {
    let uid = request.uid();
    let gid = request.gid();
    let groups = if uid == 0 {
        Vec::new()
    } else {
        supplementary_groups(request.pid())
    };
    Credentials {
        uid,
        gid,
        groups,
        umask: 0,
    }
}

/// The credentials of `request`, with the umask a create, mknod or mkdir passed (the
/// kernel leaves applying it to the filesystem: FUSE_DONT_MASK).
pub fn credentials_with_umask(request: &Request, umask: u32) -> Credentials {
    Credentials {
        umask: (umask & 0o777) as u16,
        ..credentials(request)
    }
}

fn supplementary_groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_groups(&status)
}

/// Whether process `pid` holds capability number `capability` in its effective set (read
/// from `/proc/PID/status`; a process that has gone holds none).
pub fn holds_capability(pid: u32, capability: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|status| effective_capabilities(&status) & (1 << capability) != 0)
}

/// The `CapEff:` line of a `/proc/PID/status` text (hexadecimal), 0 if missing.
pub fn effective_capabilities(status: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|rest| u64::from_str_radix(rest.trim(), 16).ok())
        .unwrap_or(0)
}

/// The `Groups:` line of a `/proc/PID/status` text.
pub fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Mode type bits select the kind; directories and symlinks are not mknod kinds.
    #[test]
    fn modes_select_kinds() {
        assert_eq!(kind_of_mode(libc::S_IFREG | 0o644), Some(FileKind::Regular));
        assert_eq!(kind_of_mode(0o644), Some(FileKind::Regular));
        assert_eq!(kind_of_mode(libc::S_IFIFO | 0o600), Some(FileKind::Fifo));
        assert_eq!(kind_of_mode(libc::S_IFSOCK), Some(FileKind::Socket));
        assert_eq!(kind_of_mode(libc::S_IFCHR), Some(FileKind::CharDevice));
        assert_eq!(kind_of_mode(libc::S_IFBLK), Some(FileKind::BlockDevice));
        assert_eq!(kind_of_mode(libc::S_IFDIR | 0o755), None);
        assert_eq!(kind_of_mode(libc::S_IFLNK), None);
        assert_eq!(permission_bits(libc::S_IFREG | 0o4755), 0o4755);
    }

    // The Groups line of /proc/PID/status parses into gids; a missing line gives none.
    #[test]
    fn groups_parse_from_status() {
        let status = "Name:\tcat\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 1000 \nVmRSS:\t1\n";
        assert_eq!(parse_groups(status), vec![4, 24, 1000]);
        assert!(parse_groups("Name:\tx\n").is_empty());
        assert!(parse_groups("Groups:\n").is_empty());
    }

    // The CapEff line parses as a hexadecimal mask; a missing one is empty.
    #[test]
    fn capabilities_parse_from_status() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000000200\n";
        assert_eq!(effective_capabilities(status), 1 << 9);
        assert_eq!(effective_capabilities("Name:\tx\n"), 0);
    }
}
