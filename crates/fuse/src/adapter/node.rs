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

/// The rename mode of FUSE rename flags, and whether the source's name becomes a whiteout;
/// `None` for unknown bits, or for exchange with no-replace or with a whiteout (which
/// rename(2) refuses with EINVAL).
pub(super) fn rename_mode(flags: RenameFlags) -> Option<(RenameMode, bool)> {
    let known =
        RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT;
    if !known.contains(flags) {
        return None;
    }
    let whiteout = flags.contains(RenameFlags::RENAME_WHITEOUT);
    let mode = match (
        flags.contains(RenameFlags::RENAME_NOREPLACE),
        flags.contains(RenameFlags::RENAME_EXCHANGE),
    ) {
        (false, false) => RenameMode::Replace,
        (true, false) => RenameMode::NoReplace,
        (false, true) if !whiteout => RenameMode::Exchange,
        _ => return None,
    };
    Some((mode, whiteout))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each rename(2) flag selects its mode, a whiteout goes with replace or no-replace;
    // contradictions are refused.
    #[test]
    fn rename_flags_translate() {
        use RenameFlags as F;
        let whiteout = F::RENAME_WHITEOUT;
        assert_eq!(rename_mode(F::empty()), Some((RenameMode::Replace, false)));
        assert_eq!(
            rename_mode(F::RENAME_NOREPLACE),
            Some((RenameMode::NoReplace, false))
        );
        assert_eq!(
            rename_mode(F::RENAME_EXCHANGE),
            Some((RenameMode::Exchange, false))
        );
        assert_eq!(rename_mode(whiteout), Some((RenameMode::Replace, true)));
        assert_eq!(
            rename_mode(whiteout | F::RENAME_NOREPLACE),
            Some((RenameMode::NoReplace, true))
        );
        assert_eq!(rename_mode(whiteout | F::RENAME_EXCHANGE), None);
        assert_eq!(rename_mode(F::RENAME_NOREPLACE | F::RENAME_EXCHANGE), None);
        assert_eq!(rename_mode(F::from_bits_retain(1 << 7)), None);
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
