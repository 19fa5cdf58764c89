//! Extended attributes, and the reserved one that carries the statistics.

use std::ffi::OsStr;

use cairn_fs::XattrFlags;
use fuser::{Errno, ReplyXattr};

use super::CairnFs;
use crate::core::GrowError;
use crate::errno::ToErrno;
use crate::stats::{STATS_XATTR, render};
use crate::stats_export::{
    STATS_JSON_XATTR, STATS_OPENMETRICS_XATTR, render_json, render_openmetrics,
};

/// The trim command: `getxattr` of `system.cairn.trim.MINIMUM_BYTES` on the mount's root
/// (root only) discards every free extent of at least that size and answers with the text
/// `trimmed_bytes: N` / `trimmed_extents: N`. FUSE passes no FITRIM, and this is the
/// channel `cairn stats` already uses.
pub const TRIM_XATTR_PREFIX: &str = "system.cairn.trim.";
/// The grow command: `getxattr` of `system.cairn.grow.SIZE_BYTES` (0: the whole device) on
/// the mount's root (root only) grows the mounted filesystem (`CoreSlot::grow`) and answers
/// `old_blocks`, `new_blocks`, `old_ags`, `new_ags` and `block_size` lines.
pub const GROW_XATTR_PREFIX: &str = "system.cairn.grow.";

/// The sync command: `getxattr` of `system.cairn.sync` on the mount's root writes every
/// file's cached data back and forces the log (`Filesystem::sync`), then answers
/// `written_back_bytes: N`. Anyone who can reach the mount may run it, as anyone may call
/// `sync(2)`; `cairn sync` first calls `syncfs` so the kernel's dirty pages arrive. The
/// kernel sends `FUSE_SYNCFS` to virtiofs servers only, so this is how `sync` reaches us.
pub const SYNC_XATTR: &str = "system.cairn.sync";

/// The size answered to a size query of a command, which runs nothing (tools ask for the
/// size first; the real call then runs it once).
const COMMAND_REPLY_BYTES_MAX: usize = 128;

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
    /// The value of a reserved attribute of `inode` read by `uid` (`size` 0 asks only for
    /// the length), or `None` if it has none.
    pub(super) fn reserved_value(
        &self,
        uid: u32,
        inode: u64,
        name: &OsStr,
        size: u32,
    ) -> Option<Result<Vec<u8>, Errno>> {
        if inode != self.root {
            return None;
        }
        let export: Option<fn(&cairn_fs::FsStats, &crate::stats::RequestStats) -> String> =
            match name.to_str() {
                Some(STATS_XATTR) => Some(render),
                Some(STATS_JSON_XATTR) => Some(render_json),
                Some(STATS_OPENMETRICS_XATTR) => Some(render_openmetrics),
                _ => None,
            };
        if let Some(export) = export {
            let stats = self.fs().ok()?.stats();
            return Some(Ok(export(&stats, &self.requests).into_bytes()));
        }
        if name == SYNC_XATTR {
            return Some(match size {
                0 => Ok(vec![b' '; COMMAND_REPLY_BYTES_MAX]),
                _ => self.sync_command(),
            });
        }
        let name = name.to_str()?;
        let (grow, argument) = match name.strip_prefix(GROW_XATTR_PREFIX) {
            Some(bytes) => (true, bytes),
            None => (false, name.strip_prefix(TRIM_XATTR_PREFIX)?),
        };
        // Commands are root's; a size query (size 0) runs nothing.
        if uid != 0 {
            return Some(Err(Errno::from_i32(libc::EPERM)));
        }
        let Ok(argument) = argument.parse::<u64>() else {
            return Some(Err(Errno::from_i32(libc::EINVAL)));
        };
        if size == 0 {
            return Some(Ok(vec![b' '; COMMAND_REPLY_BYTES_MAX]));
        }
        Some(match grow {
            true => self.grow_command(argument),
            false => self.trim_command(argument),
        })
    }

    /// Runs the grow command to `bytes` (0: the device's size).
    fn grow_command(&self, bytes: u64) -> Result<Vec<u8>, Errno> {
        let block_size = self.fs().map_err(|e| e.to_errno())?.statfs();
        let block_size = block_size.map_err(|e| e.to_errno())?.block_size;
        let report = self.core.grow((bytes > 0).then_some(bytes));
        let report = report.map_err(|error| {
            tracing::warn!(%error, "online grow refused or failed");
            Errno::from_i32(match error {
                GrowError::Busy => libc::EBUSY,
                GrowError::Refused(_) => libc::EINVAL,
                GrowError::Failed(_) => libc::EIO,
            })
        })?;
        let text = format!(
            "old_blocks: {}\nnew_blocks: {}\nold_ags: {}\nnew_ags: {}\nblock_size: {}\n",
            report.old_blocks, report.new_blocks, report.old_ags, report.new_ags, block_size
        );
        Ok(text.into_bytes())
    }

    /// Runs the sync command: everything received so far made durable.
    fn sync_command(&self) -> Result<Vec<u8>, Errno> {
        let fs = self.fs().map_err(|error| error.to_errno())?;
        let before = fs.stats().write_behind.written_back_bytes;
        if !fs.options().read_only {
            fs.sync().map_err(|error| {
                tracing::warn!(%error, "cairn sync failed");
                error.to_errno()
            })?;
        }
        let written = fs.stats().write_behind.written_back_bytes - before;
        Ok(format!("written_back_bytes: {written}\n").into_bytes())
    }

    /// Runs the trim command with the minimum extent size `minimum` (bytes).
    fn trim_command(&self, minimum: u64) -> Result<Vec<u8>, Errno> {
        let report = self
            .fs()
            .and_then(|fs| fs.trim(minimum))
            .map_err(|error| error.to_errno())?;
        let text = format!(
            "trimmed_bytes: {}\ntrimmed_extents: {}\n",
            report.bytes, report.extents
        );
        Ok(text.into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The reserved prefix covers the stats name and nothing in the user namespace.
    #[test]
    fn reserved_names() {
        assert!(is_reserved(OsStr::new(STATS_XATTR)));
        assert!(is_reserved(OsStr::new(SYNC_XATTR)));
        assert!(is_reserved(OsStr::new("system.cairn.other")));
        assert!(is_reserved(OsStr::new(&format!("{TRIM_XATTR_PREFIX}0"))));
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
