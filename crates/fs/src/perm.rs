//! Permission checks (POSIX owner/group/other bits, root bypass) and the setuid/setgid rules.

use cairn_format::inode::FileType;

use crate::FsError;
use crate::inode::InodeData;
use crate::types::Credentials;

pub(crate) const READ: u32 = 4;
pub(crate) const WRITE: u32 = 2;
pub(crate) const EXECUTE: u32 = 1;

const SETUID: u16 = 0o4000;
const SETGID: u16 = 0o2000;
const STICKY: u16 = 0o1000;
const GROUP_EXECUTE: u16 = 0o010;

/// Checks that `who` may access `data` with `mask` (R=4, W=2, X=1).
pub(crate) fn check(data: &InodeData, who: &Credentials, mask: u32) -> Result<(), FsError> {
    let mode = u32::from(data.core.mode);
    if who.uid == 0 {
        // Root may do anything but execute a file nobody may execute.
        let any_exec = mode & 0o111 != 0 || data.file_type() == Some(FileType::Directory);
        return match mask & EXECUTE == 0 || any_exec {
            true => Ok(()),
            false => Err(FsError::PermissionDenied),
        };
    }
    let bits = if who.uid == data.core.uid {
        (mode >> 6) & 7
    } else if who.in_group(data.core.gid) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    match bits & mask == mask {
        true => Ok(()),
        false => Err(FsError::PermissionDenied),
    }
}

/// Whether `who` owns the inode (or is root).
pub(crate) fn is_owner(data: &InodeData, who: &Credentials) -> bool {
    who.uid == 0 || who.uid == data.core.uid
}

/// Sticky directories: only the owner of the entry or of the directory (or root) may remove
/// or rename it.
pub(crate) fn check_sticky(
    dir: &InodeData,
    victim: &InodeData,
    who: &Credentials,
) -> Result<(), FsError> {
    if dir.core.mode & STICKY == 0 || is_owner(dir, who) || is_owner(victim, who) {
        return Ok(());
    }
    Err(FsError::PermissionDenied)
}

/// Clears setuid, and setgid if group-executable (chown, truncate and write by non-root).
pub(crate) fn kill_suid(data: &mut InodeData) -> bool {
    let mut mask = SETUID;
    if data.core.mode & GROUP_EXECUTE != 0 {
        mask |= SETGID;
    }
    let before = data.core.mode;
    data.core.mode &= !mask;
    before != data.core.mode
}

/// The mode a chmod by `who` really sets: non-root callers outside the file's group lose
/// setgid.
pub(crate) fn chmod_mode(data: &InodeData, who: &Credentials, mode: u16) -> u16 {
    let mut mode = mode & cairn_format::inode::MODE_PERMISSION_MASK;
    if who.uid != 0 && !who.in_group(data.core.gid) && data.file_type() != Some(FileType::Directory)
    {
        mode &= !SETGID;
    }
    mode
}

/// Setgid directories hand their group (and, to subdirectories, the setgid bit) down.
pub(crate) fn inherit(
    parent: &InodeData,
    who: &Credentials,
    is_dir: bool,
    mode: u16,
) -> (u32, u16) {
    if parent.core.mode & SETGID == 0 {
        return (who.gid, mode);
    }
    let mode = if is_dir { mode | SETGID } else { mode };
    (parent.core.gid, mode)
}
