//! Extended attributes, and the reserved one that carries the statistics.

use std::ffi::OsStr;

use cairn_fs::XattrFlags;
use fuser::{Errno, ReplyXattr};

use super::CairnFs;
use crate::stats::{STATS_XATTR, render};

/// Answers a getxattr or listxattr with `value`: its size when `size` is 0, the value when
/// it fits, ERANGE when it does not.
pub(super) fn reply_value(reply: ReplyXattr, size: u32, value: &[u8]) {
    let Ok(len) = u32::try_from(value.len()) else {
        reply.error(Errno::from_i32(libc::E2BIG));
        return;
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(value);
    }
}

/// The filesystem flags of setxattr(2) flags; `None` for unknown bits or both at once.
pub(super) fn xattr_flags(flags: i32) -> Option<XattrFlags> {
    match flags {
        0 => Some(XattrFlags::Any),
        libc::XATTR_CREATE => Some(XattrFlags::Create),
        libc::XATTR_REPLACE => Some(XattrFlags::Replace),
        _ => None,
    }
}

/// A listxattr value: every name followed by a NUL.
pub(super) fn name_list(names: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
    for name in names {
        out.extend_from_slice(name);
        out.push(0);
    }
    out
}

/// Whether `name` is in the namespace this daemon reserves for itself.
pub(super) fn is_reserved(name: &OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b"system.cairn.")
}

impl CairnFs {
    /// The value of a reserved attribute of `inode`, or `None` if it has none.
    pub(super) fn reserved_value(&self, inode: u64, name: &OsStr) -> Option<Vec<u8>> {
        if inode != self.root || name != STATS_XATTR {
            return None;
        }
        let stats = self.fs().ok()?.stats();
        Some(render(&stats, &self.requests).into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The reserved prefix covers the stats name and nothing in the user namespace.
    #[test]
    fn reserved_names() {
        assert!(is_reserved(OsStr::new(STATS_XATTR)));
        assert!(is_reserved(OsStr::new("system.cairn.other")));
        assert!(!is_reserved(OsStr::new("user.cairn.stats")));
        assert!(!is_reserved(OsStr::new("system.posix_acl_access")));
    }

    // setxattr flags map one to one; list values are NUL-terminated names.
    #[test]
    fn flags_and_lists() {
        assert_eq!(xattr_flags(0), Some(XattrFlags::Any));
        assert_eq!(xattr_flags(libc::XATTR_CREATE), Some(XattrFlags::Create));
        assert_eq!(xattr_flags(libc::XATTR_REPLACE), Some(XattrFlags::Replace));
        assert_eq!(xattr_flags(3), None);
        let names = [b"user.a".to_vec(), b"trusted.bb".to_vec()];
        assert_eq!(name_list(&names), b"user.a\0trusted.bb\0");
        assert!(name_list(&[]).is_empty());
    }
}
