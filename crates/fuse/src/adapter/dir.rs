//! Directory listings: readdir and readdirplus replies filled from `Filesystem::readdir`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use cairn_fs::{DirEntry, FsError};
use fuser::{Generation, ReplyDirectory, ReplyDirectoryPlus};

use super::CairnFs;
use crate::convert::file_type;

/// Entries asked of the filesystem per readdir request (more than a 4 KiB reply holds
/// for short names; the rest is read again from the last cookie sent).
const READDIR_BATCH: usize = 128;
/// Entries per readdirplus request (each carries attributes: about 30 fit in 4 KiB).
const READDIRPLUS_BATCH: usize = 48;

fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl CairnFs {
    /// Fills `reply` with as many entries after `cookie` as fit.
    pub(super) fn fill_readdir(
        &self,
        inode: u64,
        cookie: u64,
        reply: &mut ReplyDirectory,
    ) -> Result<(), FsError> {
        for entry in self.fs()?.readdir(inode, cookie, READDIR_BATCH)? {
            let name = OsStr::from_bytes(&entry.name);
            let kind = file_type(entry.kind);
            if reply.add(self.node(entry.inode), entry.cookie, kind, name) {
                break;
            }
        }
        Ok(())
    }

    /// Fills `reply` with the entries after `cookie` and their attributes. Every entry but
    /// "." and ".." counts as a lookup in the kernel, so each is looked up (taking the
    /// reference the kernel will later forget); an entry that no longer fits gives its
    /// reference back.
    pub(super) fn fill_readdirplus(
        &self,
        inode: u64,
        cookie: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> Result<(), FsError> {
        for entry in self.fs()?.readdir(inode, cookie, READDIRPLUS_BATCH)? {
            match self.add_plus(inode, &entry, reply) {
                Ok(true) => break,
                Ok(false) => {}
                // Removed since the listing was read: leave it out.
                Err(FsError::NotFound) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Adds one readdirplus entry; returns whether the reply is full.
    fn add_plus(
        &self,
        dir: u64,
        entry: &DirEntry,
        reply: &mut ReplyDirectoryPlus,
    ) -> Result<bool, FsError> {
        let counted = !is_dot_or_dotdot(&entry.name);
        let attr = if counted {
            self.fs()?.lookup(dir, &entry.name)?
        } else {
            self.fs()?.getattr(entry.inode)?
        };
        let ttl = self.settings.entry_timeout.min(self.settings.attr_timeout);
        let full = reply.add(
            self.node(attr.inode),
            entry.cookie,
            OsStr::from_bytes(&entry.name),
            &ttl,
            &self.fuse_attr(&attr),
            Generation(u64::from(attr.generation)),
        );
        if full && counted {
            self.drop_reference(attr.inode, 1);
        }
        Ok(full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Only the two dot entries are exempt from lookup counting.
    #[test]
    fn dot_entries_are_recognised() {
        assert!(is_dot_or_dotdot(b"."));
        assert!(is_dot_or_dotdot(b".."));
        assert!(!is_dot_or_dotdot(b"..."));
        assert!(!is_dot_or_dotdot(b".hidden"));
    }
}
