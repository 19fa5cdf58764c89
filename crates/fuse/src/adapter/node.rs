//! Helpers for requests on names and inodes: attribute changes.

use std::time::SystemTime;

use cairn_fs::SetAttr;

use crate::convert::{permission_bits, time_or_now};

/// The attribute changes of a FUSE setattr request.
pub(super) fn set_attr(
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    times: (Option<fuser::TimeOrNow>, Option<fuser::TimeOrNow>),
    ctime: Option<SystemTime>,
) -> SetAttr {
    SetAttr {
        mode: mode.map(permission_bits),
        uid,
        gid,
        size,
        atime: times.0.map(time_or_now),
        mtime: times.1.map(time_or_now),
        ctime,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        );
        assert_eq!(changes.mode, Some(0o2755));
        assert_eq!(changes.uid, Some(7));
        assert_eq!(changes.gid, None);
        assert_eq!(changes.size, Some(4096));
        assert_eq!(changes.atime, Some(cairn_fs::TimeOrNow::Now));
        assert_eq!(changes.mtime, None);
    }
}
