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
/// Directories up to this size (bytes of entries) get attributes in every readdirplus
/// reply; about 2,000 entries of short names.
const PLUS_DIR_BYTES_MAX: u64 = 64 * 1024;

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

    /// Fills `reply` with the entries after `cookie`, with their attributes where
    /// `with_attributes` says. Every entry with attributes but "." and ".." counts as a lookup
    /// in the kernel, so each is looked up (taking the reference the kernel will later
    /// forget); an entry that no longer fits gives its reference back.
    pub(super) fn fill_readdirplus(
        &self,
        inode: u64,
        cookie: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> Result<(), FsError> {
        if !self.with_attributes(inode, cookie)? {
            return self.fill_readdirplus_bare(inode, cookie, reply);
        }
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

    /// Whether a readdirplus of `dir` from `cookie` carries attributes: always in a directory
    /// of up to `PLUS_DIR_BYTES_MAX`, whose entries' inodes come in a few chunk reads and are
    /// usually looked at next (`find`, `ls -l`, `du`), and in the first reply of a bigger
    /// one (as the kernel's `READDIRPLUS_AUTO` would ask): a plain listing of a directory of
    /// 100,000 files must not load, and make the kernel hold, 100,000 inodes.
    fn with_attributes(&self, dir: u64, cookie: u64) -> Result<bool, FsError> {
        Ok(cookie == 0 || self.fs()?.getattr(dir)?.size <= PLUS_DIR_BYTES_MAX)
    }

    /// Fills `reply` with the entries after `cookie` without attributes (node id 0: the
    /// kernel lists them and looks each up only if asked about it).
    fn fill_readdirplus_bare(
        &self,
        inode: u64,
        cookie: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> Result<(), FsError> {
        for entry in self.fs()?.readdir(inode, cookie, READDIRPLUS_BATCH)? {
            let name = OsStr::from_bytes(&entry.name);
            let kind = file_type(entry.kind);
            if reply.add_without_attributes(self.node(entry.inode), entry.cookie, kind, name) {
                break;
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
