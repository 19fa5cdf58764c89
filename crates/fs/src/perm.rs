//! Permission checks (POSIX owner/group/other bits, root bypass) and the setuid/setgid rules.

use cairn_format::acl::Acl;
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

/// Checks that `who` may access `data` with `mask` (R=4, W=2, X=1), as Linux's
/// `generic_permission`: root may do anything but execute a file nobody may execute; the
/// owner gets the owner bits; others go through the access ACL `acl` when the inode has one
/// and its group bits (the ACL's mask) are not empty, else the group or other bits. `acl`
/// must be the inode's access ACL whenever `needs_acl` says so.
pub(crate) fn check(
    data: &InodeData,
    acl: Option<&Acl>,
    who: &Credentials,
    mask: u32,
) -> Result<(), FsError> {
    let mode = u32::from(data.core.mode);
    if who.uid == 0 {
        let any_exec = mode & 0o111 != 0 || data.file_type() == Some(FileType::Directory);
        return match mask & EXECUTE == 0 || any_exec {
            true => Ok(()),
            false => Err(FsError::PermissionDenied),
        };
    }
    if who.uid != data.core.uid
        && mode & 0o070 != 0
        && let Some(acl) = acl
    {
        return crate::acl::permission(acl, data.core.gid, who, mask);
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

/// Whether a check by `who` on `data` consults the access ACL: callers other than root and
/// the owner, on an inode with an attr fork (where an ACL may be) and group bits.
pub(crate) fn needs_acl(data: &InodeData, who: &Credentials) -> bool {
    who.uid != 0
        && who.uid != data.core.uid
        && data.core.mode & 0o070 != 0
        && data.core.attr_format.is_some()
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

/// Clears the set-ID bits a data change by an unprivileged `writer` (one without
/// CAP_FSETID) clears on Linux: setuid always, setgid when the file is group-executable or
/// `writer` is outside its group. Returns whether the mode changed.
pub(crate) fn clear_set_id(data: &mut InodeData, writer: &Credentials) -> bool {
    let mut mask = SETUID;
    if data.core.mode & GROUP_EXECUTE != 0 || !writer.in_group(data.core.gid) {
        mask |= SETGID;
    }
    let before = data.core.mode;
    data.core.mode &= !mask;
    before != data.core.mode
}

/// The set-ID bits a change by `who` clears: none for root (which holds CAP_FSETID), else
/// as `clear_set_id` says (write, truncate, fallocate).
pub(crate) fn clear_set_id_unless_root(data: &mut InodeData, who: &Credentials) -> bool {
    who.uid != 0 && clear_set_id(data, who)
}

/// The set-ID bits a chown by `who` clears (any file but a directory): setuid always,
/// setgid when group-executable or, for callers other than root, when `who` is outside the
/// file's group.
pub(crate) fn clear_set_id_on_chown(data: &mut InodeData, who: &Credentials) {
    if data.is_dir() {
        return;
    }
    let mut mask = SETUID;
    let outside = who.uid != 0 && !who.in_group(data.core.gid);
    if data.core.mode & GROUP_EXECUTE != 0 || outside {
        mask |= SETGID;
    }
    data.core.mode &= !mask;
}

/// Whether `mode` differs from the inode's only by clearing set-ID bits: the change the
/// kernel asks for on behalf of a writer when it kills privileges itself.
pub(crate) fn only_clears_set_id(data: &InodeData, mode: u16) -> bool {
    let current = data.core.mode & cairn_format::inode::MODE_PERMISSION_MASK;
    let cleared = current & !mode;
    mode & !current == 0 && cleared != 0 && cleared & !(SETUID | SETGID) == 0
}

/// The mode a chmod by `who` really sets: callers other than root outside the group the
/// file will have (`gid`) lose setgid, directories included, as Linux's `setattr_prepare`.
pub(crate) fn chmod_mode(who: &Credentials, gid: u32, mode: u16) -> u16 {
    let mut mode = mode & cairn_format::inode::MODE_PERMISSION_MASK;
    if who.uid != 0 && !who.in_group(gid) {
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
