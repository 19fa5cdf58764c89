//! Helpers for requests on names and inodes: attribute changes.

use std::time::SystemTime;

use cairn_fs::{RenameMode, SetAttr};
use fuser::RenameFlags;

use crate::convert::{permission_bits, time_or_now};

/// The attribute changes of a FUSE setattr request.
pub(super) fn set_attr(
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    times: (Option<fuser::TimeOrNow>, Option<fuser::TimeOrNow>),
    ctime: Option<SystemTime>,
    file: Option<fuser::FileHandle>,
) -> SetAttr {
    SetAttr {
        mode: mode.map(permission_bits),
        uid,
        gid,
        size,
        atime: times.0.map(time_or_now),
        mtime: times.1.map(time_or_now),
        ctime,
        file: file.map(|handle| handle.0),
    }
}

/// The rename mode of FUSE rename flags; `None` for whiteouts, unknown bits, or both
/// exchange and no-replace (which rename(2) refuses with EINVAL).
pub(super) fn rename_mode(flags: RenameFlags) -> Option<RenameMode> {
    let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
    if !known.contains(flags) {
        return None;
    }
    match (
        flags.contains(RenameFlags::RENAME_NOREPLACE),
        flags.contains(RenameFlags::RENAME_EXCHANGE),
    ) {
        (false, false) => Some(RenameMode::Replace),
        (true, false) => Some(RenameMode::NoReplace),
        (false, true) => Some(RenameMode::Exchange),
        (true, true) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each rename(2) flag selects its mode; whiteouts and contradictions are refused.
    #[test]
    fn rename_flags_translate() {
        assert_eq!(rename_mode(RenameFlags::empty()), Some(RenameMode::Replace));
        assert_eq!(
            rename_mode(RenameFlags::RENAME_NOREPLACE),
            Some(RenameMode::NoReplace)
        );
        assert_eq!(
            rename_mode(RenameFlags::RENAME_EXCHANGE),
            Some(RenameMode::Exchange)
        );
        assert_eq!(rename_mode(RenameFlags::RENAME_WHITEOUT), None);
        let both = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        assert_eq!(rename_mode(both), None);
    }

    // Mode type bits are dropped, times and ids carried over.
    #[test]
    fn setattr_arguments_translate() {
        let changes = set_attr(
            Some(libc::S_IFREG | 0o2755),
            Some(7),
            None,
            Some(4096),
            (Some(fuser::TimeOrNow::Now), None),
            None,
            Some(fuser::FileHandle(9)),
        );
        assert_eq!(changes.mode, Some(0o2755));
        assert_eq!(changes.uid, Some(7));
        assert_eq!(changes.gid, None);
        assert_eq!(changes.size, Some(4096));
        assert_eq!(changes.atime, Some(cairn_fs::TimeOrNow::Now));
        assert_eq!(changes.mtime, None);
        assert_eq!(changes.file, Some(9));
    }
}
